"""Issue 23: rotations stay float32+ under autocast and casts, every target scored once, and smaller defects."""

from __future__ import annotations

import importlib
import math

import pytest
import torch

from posenc import build_model
from posenc.encodings.base import Inputs

core = importlib.import_module("posenc.attention")  # the module (the package exports its function)
OFFSET, STARTS = 5, (0, 1, 1000, 30_000, 65_530)


def _scores(q: torch.Tensor, k: torch.Tensor) -> list[float]:
    """Score (float64) of the query at each start + OFFSET with the key at start: q, k (T, D) rotated."""
    return [float((q[s + OFFSET].double() * k[s].double()).sum()) for s in STARTS]


def test_rotation_under_bf16_autocast_keeps_relative_scores_to_64k(monkeypatch):
    """A fixed (bf16) q, k pair at offset 5: the rotated pair the attention core hands to SDPA under bf16 autocast
    scores the same at every position to 64K within 1e-4 (bf16 cos/sin spread it by ~0.1)."""
    model = build_model({"encoding": "rope", "n_layer": 1, "n_head": 1, "d_model": 64})
    T = STARTS[-1] + OFFSET + 1
    g = torch.Generator().manual_seed(0)
    q0, k0 = torch.randn(64, generator=g).bfloat16(), torch.randn(64, generator=g).bfloat16()
    q, k = q0.expand(1, 1, T, 64).contiguous(), k0.expand(1, 1, T, 64).contiguous()
    phases = model.blocks[0].attn.enc.phases(Inputs(torch.zeros(1, T, 64), torch.arange(T)))
    seen = {}

    def spy(q, k, v, **kw):
        seen.update(q=q, k=k)
        return torch.zeros_like(v)

    monkeypatch.setattr(core.F, "scaled_dot_product_attention", spy)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = core.attention(q, k, k.clone(), phases=phases)
    assert out.dtype == torch.bfloat16 and seen["q"].dtype == torch.float32
    scores = _scores(seen["q"][0, 0], seen["k"][0, 0])
    assert max(scores) - min(scores) < 1e-4, scores
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the autograd reference too
        rq, rk = core.rotate(q, phases), core.rotate(k, phases)
    assert rq.dtype == torch.float32
    scores = _scores(rq[0, 0], rk[0, 0])
    assert max(scores) - min(scores) < 1e-4, scores


@pytest.mark.parametrize("cast", ["float", "half", "bf16"])
def test_casts_keep_float64_frequencies_and_relative_scores_to_64k(cast):
    """After .float() / .half() / .to(bf16) RoPE's frequencies are still float64: the angles to 131072 stay within
    1e-5 rad of float64's (a float32 copy puts them up to 3.9e-3 off), and a fixed float32 q, k pair at offset 5
    scores the same to 64K within 1e-4."""
    model = build_model({"encoding": "rope", "n_layer": 1, "n_head": 1, "d_model": 64})
    enc = model.blocks[0].attn.enc
    assert enc.inv_freq.dtype == torch.float64
    model = {"float": model.float, "half": model.half, "bf16": lambda: model.to(torch.bfloat16)}[cast]()
    assert enc.inv_freq.dtype == torch.float64
    pos = torch.tensor([4095, 65536, 131071])
    exact = pos.double()[:, None] * (10000.0 ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64))
    diff = torch.remainder(enc.phases(Inputs(torch.zeros(1, 3, 64), pos))[0, 0].double() - exact + math.pi, 2 * math.pi) - math.pi
    assert float(diff.abs().max()) < 1e-5
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, 64, generator=g), torch.randn(1, 1, 1, 64, generator=g)
    scores = []
    for s in STARTS:
        phi = enc.phases(Inputs(torch.zeros(1, 2, 64), torch.tensor([s, s + OFFSET])))
        scores.append(float((core.rotate(q, phi[..., 1:, :]).double() * core.rotate(k, phi[..., :1, :]).double()).sum()))
    assert max(scores) - min(scores) < 1e-4, scores
    model.double()  # raising precision is allowed
    assert enc.inv_freq.dtype == torch.float64


def test_bugs_inside_a_scheme_raise_with_their_traceback_and_bad_values_are_one_line_errors():
    """A mistyped attribute inside a scheme is a bug (AttributeError, traceback), not 'invalid parameters'."""
    from posenc import encodings
    from posenc.encodings.base import Encoding
    from posenc.errors import PosencError

    @encodings.register
    class Broken(Encoding):
        name = "issue23-broken"

        def __init__(self, dims, width: int = 2):
            super().__init__(dims)
            self.width = self.widht  # the bug

    try:
        with pytest.raises(AttributeError, match="widht"):
            encodings.get("issue23-broken")
        with pytest.raises(PosencError, match="width='x': expected int"):  # a bad value is still the user's
            encodings.get("issue23-broken:width=x")
    finally:
        encodings.unregister("issue23-broken")
    for params, message in (({"schedule": "yarn", "schedule_params": 5}, "expected dict"),
                            ({"schedule": "yarn", "schedule_params": {"factor": "x"}}, "factor='x': expected a finite number"),
                            ({"schedule_params": {"factor": 2.0}}, "need a schedule")):
        with pytest.raises(PosencError, match=message):
            encodings.get("rope", **params)


def test_fox_log_gates_take_the_inputs_precision():
    """float64 gate logits give float64 log-gates (they were taken in float32: 1e-7 off); bf16 ones float32."""
    from posenc.encodings.forget import log_forget_cumsum

    logits = torch.randn(2, 3, 257, dtype=torch.float64) * 4
    exact = torch.cumsum(torch.log(torch.sigmoid(logits)), dim=-1)
    assert float((log_forget_cumsum(logits) - exact).abs().max()) < 1e-12
    low = log_forget_cumsum(logits.bfloat16())
    assert low.dtype == torch.float64
    torch.testing.assert_close(low, log_forget_cumsum(logits.bfloat16().float()), rtol=0, atol=0)


def test_path_fox_matches_flash_linear_attentions_pathfox():
    """flash-linear-attention's PaTH-FoX: softmax((q^T H_i..H_{j+1} k_j + G_i - G_j) / sqrt(D)) v, G = cumsum of the
    log-gates (``parallel_path_attn``). ``path+forget:scaled=true`` gives it; ``path+forget`` adds FoX's unscaled gate."""
    from posenc import encodings
    from posenc.encodings.base import Dims
    from posenc.encodings.householder_naive import path_scores_naive

    torch.manual_seed(0)
    dims = Dims(n_head=2, head_dim=16, d_model=32, vocab_size=256, train_length=16)
    x = torch.randn(1, 12, 32, dtype=torch.float64)
    inp = Inputs(x, torch.arange(12))
    q, k, v = (torch.randn(1, 2, 12, 16, dtype=torch.float64) for _ in range(3))
    fox = encodings.get("path+forget:scaled=true", dims).double()
    plain = encodings.get("path+forget", dims).double()
    plain.load_state_dict(fox.state_dict())
    path, gate = fox.parts
    w, beta = path.gates(x)
    G = torch.cumsum(torch.nn.functional.logsigmoid(gate.gate(x).transpose(1, 2)), dim=-1)
    s = path_scores_naive(q, k, w, beta) + G[..., :, None] - G[..., None, :]
    ref = torch.softmax(s / math.sqrt(16), dim=-1) @ v
    torch.testing.assert_close(fox.attend(q, k, v, inp), ref, rtol=0, atol=1e-10)
    fox_unscaled = torch.softmax(path_scores_naive(q, k, w, beta) / math.sqrt(16) + G[..., :, None] - G[..., None, :], dim=-1) @ v
    torch.testing.assert_close(plain.attend(q, k, v, inp), fox_unscaled, rtol=0, atol=1e-10)


def test_eval_says_which_text_it_scored_and_when_it_is_fewer_tokens_than_asked(tmp_path, capsys):
    from posenc.cli import main

    run = tmp_path / "run"
    assert main(["train", "--scheme", "rope", "--preset", "quick", "--steps", "1", "--out", str(run)]) == 0
    capsys.readouterr()
    assert main(["eval", str(run), "--multiples", "1", "--max-tokens", "100000000"]) == 0
    text = [line for line in capsys.readouterr().out.splitlines() if line.startswith("text: ")]
    assert len(text) == 1 and "held-out document(s) of shakespeare" in text[0]
    assert "fewer than --max-tokens 100000000: no other held-out document has" in text[0]
    assert "posenc compare scores this text when its longest length is" in text[0]


def test_decode_with_an_id_outside_the_vocabulary_is_a_one_line_error():
    from posenc.errors import PosencError
    from posenc.model import Cache

    model = build_model({"encoding": "rope", "n_layer": 1, "n_head": 2, "d_model": 32, "vocab_size": 50})
    for bad in (50, -1):
        with pytest.raises(PosencError, match=r"token ids must lie in \[0, 50\)"):
            model.decode(torch.tensor([[1, bad]]), Cache(1))


def test_xpos_refuses_decreasing_positions():
    """Decreasing position ids gave NaN: the decay factor grows without bound for keys after their query."""
    from posenc.errors import PosencError

    model = build_model({"encoding": "xpos", "n_layer": 1, "n_head": 2, "d_model": 32})
    tokens = torch.randint(0, 256, (1, 10))
    assert torch.isfinite(model.hidden(tokens, torch.arange(10) * 3)).all()  # gaps are fine
    with pytest.raises(PosencError, match="xpos needs non-decreasing position ids"):
        model.hidden(tokens, torch.arange(10).flip(0))
