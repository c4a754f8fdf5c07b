"""posenc.rope ties both worlds: own-model schedules equal transformers' frequencies for the
parameters the Hugging Face adapter produces; one ReRoPE, blockwise against its naive
reference (values and gradients), identical in own models and in the HF attention function."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402

from posenc import encodings, rope  # noqa: E402
from posenc.attention import Bias, rotate  # noqa: E402
from posenc.cli.main import main  # noqa: E402
from posenc.encodings.base import Dims, Inputs  # noqa: E402
from posenc.errors import PosencError  # noqa: E402
from posenc.hf import rerope as hf_rerope  # noqa: E402
from posenc.hf import schedules  # noqa: E402
from posenc.hf.adaptation import Adaptation  # noqa: E402
from posenc.hf.rope_parameters import hf_rope_parameters  # noqa: E402
from posenc.hf.schedules import Extension  # noqa: E402
from posenc.rope import rerope  # noqa: E402

D, THETA, L0 = 32, 10000.0, 256


def hf_frequencies(rope_parameters: dict, seq_len=None) -> tuple[torch.Tensor, float]:
    """transformers' (inv_freq float64, attention factor) for a Llama config with these rope_parameters."""
    cfg = LlamaConfig(
        hidden_size=4 * D,
        num_attention_heads=4,
        head_dim=D,
        max_position_embeddings=L0,
        rope_parameters=rope_parameters,
    )
    kind = rope_parameters["rope_type"]
    if kind == "default":
        inv, af = LlamaRotaryEmbedding.compute_default_rope_parameters(cfg)
    else:
        inv, af = ROPE_INIT_FUNCTIONS[kind](cfg, "cpu", seq_len=seq_len)
    return inv.double(), float(af)


@pytest.mark.parametrize("name", rope.NAMES)
@pytest.mark.parametrize("factor", [2.0, 8.0])
def test_own_frequencies_equal_transformers_for_the_adapter_parameters(name, factor):
    params = schedules.extension_params(Extension(name, factor), L0)
    hf_params = hf_rope_parameters(name, params, THETA, D)
    dims = Dims(n_head=4, head_dim=D, d_model=4 * D, vocab_size=256, train_length=L0)
    enc = encodings.get("rope", dims, rope_theta=THETA, schedule=name, schedule_params=params)
    ref, ref_af = hf_frequencies(hf_params)
    assert torch.allclose(enc.inv_freq, ref, rtol=1e-6, atol=0)
    assert enc.logit_scale == pytest.approx(ref_af**2, rel=1e-12)
    if name == "dynamic":  # beyond L0 the base grows with the current length
        inv, af = rope.SCHEDULES[name](D, THETA, params, 3 * L0)
        ref, ref_af = hf_frequencies(hf_params, seq_len=3 * L0)
        assert torch.allclose(inv, ref, rtol=1e-6, atol=0) and af == ref_af == 1.0
        assert inv[-1] < enc.inv_freq[-1] / 1.5
    plain = rope.rope_inv_freq(D, THETA)
    if name in ("none", "dynamic", *rope.RELATIVE):  # dynamic: plain up to L0
        assert torch.equal(enc.inv_freq, plain)
    else:
        assert enc.inv_freq[-1] < plain[-1] / 1.5  # the lowest frequency is interpolated


def test_adapter_installs_the_same_frequencies():
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=97,
        hidden_size=4 * D,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        head_dim=D,
        max_position_embeddings=L0,
        rope_parameters={"rope_type": "default", "rope_theta": THETA},
    )
    model = LlamaForCausalLM(cfg).eval()
    adapted = Adaptation(model)
    for name in rope.NAMES:
        adapted.set_schedule(Extension(name, 4.0))
        inv, af = rope.SCHEDULES[name](D, THETA, schedules.extension_params(Extension(name, 4.0), L0), None)
        assert torch.allclose(model.model.rotary_emb.inv_freq.double(), inv, rtol=1e-6), name
        assert float(model.model.rotary_emb.attention_scaling) == pytest.approx(af, rel=1e-6), name
        assert (model.config._attn_implementation == hf_rerope.ATTN_NAME) == (name in rope.RELATIVE)


def _inputs(B, H, Hkv, Tq, Tk, Dh, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Tq, Dh, dtype=dtype, generator=g, requires_grad=True)
    k = torch.randn(B, Hkv, Tk, Dh, dtype=dtype, generator=g, requires_grad=True)
    v = torch.randn(B, Hkv, Tk, Dh + 2, dtype=dtype, generator=g, requires_grad=True)
    return q, k, v


@pytest.mark.parametrize("pairing", ["half", "adjacent"])
@pytest.mark.parametrize(
    "window,leak,block,tq", [(1, None, 5, 37), (6, None, 7, 37), (6, 4.0, 7, 37), (11, 2.5, 16, 5), (50, 3.0, 8, 37)]
)
def test_blockwise_equals_naive_values_and_gradients(pairing, window, leak, block, tq):
    """float64, GQA (4 query heads on 2 KV heads), decoding queries (Tq < Tk), a bias and a logit scale."""
    Tk, Dh = 37, 8
    q, k, v = _inputs(2, 4, 2, tq, Tk, Dh, torch.float64, seed=window + block)
    table = torch.randn(
        1, 4, Tk, Tk, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True
    )

    tiles = []

    def bias(qs, qe, ks, ke):
        tiles.append((qe - qs, ke - ks))
        return table[:, :, qs:qe, ks:ke]

    inv = rope.rope_inv_freq(Dh)
    kw = dict(pairing=pairing, bias=Bias(bias), scale=0.7)
    fast = rerope.rerope_attention(q, k, v, inv, window, leak, block_size=block, **kw)
    assert max(r for r, _ in tiles) <= block and sum(r * c for r, c in tiles) <= tq * (Tk + block)  # no Tq x Tk matrix
    ref = rerope.naive(q, k, v, inv, window, leak, **kw)
    assert fast.shape == (2, 4, tq, Dh + 2) and fast.dtype == torch.float64
    torch.testing.assert_close(fast, ref, atol=1e-12, rtol=1e-10)
    w = torch.randn_like(ref)  # a random cotangent: every output element matters
    for a, b in zip(
        torch.autograd.grad((fast * w).sum(), (q, k, v, table)), torch.autograd.grad((ref * w).sum(), (q, k, v, table))
    ):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("leak", [None, 4.0])
def test_fused_kernel_equals_matmul_path(leak):
    q, k, v = (t.detach() for t in _inputs(1, 4, 2, 45, 45, 16, torch.float32, seed=3))
    v = v[..., :16]  # the flash kernel needs Dv == D
    inv = rope.rope_inv_freq(16)
    table = torch.randn(1, 4, 45, 45, generator=torch.Generator().manual_seed(2))
    for bias in (None, Bias(lambda qs, qe, ks, ke: table[:, :, qs:qe, ks:ke])):
        with torch.no_grad():
            fused = rerope.rerope_attention(q, k, v, inv, 9, leak, bias=bias, block_size=10, fused=True)
            plain = rerope.rerope_attention(q, k, v, inv, 9, leak, bias=bias, block_size=10, fused=False)
            ref = rerope.naive(q, k, v, inv, 9, leak, bias=bias)
        torch.testing.assert_close(fused, plain, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(fused, ref, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("name,leak", [("rerope", None), ("leaky-rerope", 4.0)])
def test_own_model_and_hf_rerope_are_one_attention(name, leak):
    """RoPE(schedule=...).attend and the HF attention function on the same q, k, v."""
    B, H, T, w = 2, 4, 40, 7
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=97,
        hidden_size=H * D,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=H,
        head_dim=D,
        max_position_embeddings=L0,
        rope_parameters={"rope_type": "default", "rope_theta": THETA},
    )
    adapted = Adaptation(LlamaForCausalLM(cfg).eval())
    adapted.set_schedule(Extension(name, 2.0, window=w, leak=leak))
    params = {"window": w} if leak is None else {"window": w, "leak": leak}
    dims = Dims(n_head=H, head_dim=D, d_model=H * D, vocab_size=97, train_length=L0)
    enc = encodings.get("rope", dims, rope_theta=THETA, schedule=name, schedule_params=params)
    q, k, v = (t.detach() for t in _inputs(B, H, H, T, T, D, torch.float32, seed=5))
    v = v[..., :D]
    pos = torch.arange(T)
    with torch.no_grad():
        own = enc.attend(q, k, v, Inputs(torch.zeros(B, T, H * D), pos, torch.zeros(B, T, dtype=torch.long)))
        hf, _ = hf_rerope.attention_forward(
            adapted.model.model.layers[0].self_attn,
            q,
            k,
            v,
            None,
            D**-0.5,
            position_ids=pos[None],
            rerope=adapted.rerope,
        )
    torch.testing.assert_close(hf.transpose(1, 2), own, atol=1e-6, rtol=1e-5)
    assert adapted.rerope[1:] == (w, leak)  # one meaning of leak: Su's k


def test_bad_schedule_flags_are_one_line(tmp_path, capsys):
    for argv, message in (
        (["--schedules", "leaky_rerope"], "unknown rope schedule 'leaky_rerope'"),
        (["--schedules", "yarn", "--passkey-schedules", "nosuch"], "unknown rope schedule 'nosuch'"),
    ):
        assert main(["extend", *argv, "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "o").exists()


def test_leak_means_k_everywhere():
    """Su's k > 1 is rejected at or below 1 by the one validator, for own models and the adapter alike."""
    for bad in (1.0, 0.5):
        with pytest.raises(PosencError, match="leak k must be > 1"):
            rope.schedule_params("leaky-rerope", L0, {"window": 4, "leak": bad})
        with pytest.raises(PosencError, match="leak k must be > 1"):
            schedules.extension_params(Extension("leaky-rerope", 2.0, window=4, leak=bad), L0)
    T, w, k = 12, 3, 4.0
    q, key, _ = (t.detach() for t in _inputs(1, 1, 1, T, T, 4, torch.float64, seed=0))
    inv, i = rope.rope_inv_freq(4), T - 1
    rel = [float(i - j) if i - j < w else w + (i - j - w) / k for j in range(T)]  # Su: w + (i-j-w)/k beyond w
    scores = torch.stack([(rotate(q[0, 0, i], r * inv) * key[0, 0, j]).sum() / 2.0 for j, r in enumerate(rel)])
    eye = torch.eye(T, dtype=torch.float64)[None, None]  # values = one-hot: the output row is the attention weights
    weights = rerope.rerope_attention(q, key, eye, inv, w, k)[0, 0, i]
    torch.testing.assert_close(weights, torch.softmax(scores, 0), atol=1e-14, rtol=1e-12)
