"""Forget gate: cumsum tiles == explicit products; the chunked path == the full matrix; long inputs stay finite."""

import pytest
import torch

from posenc import encodings
from posenc.attention import Bias, attention, naive_attention
from posenc.encodings.base import Dims, Inputs
from posenc.encodings.forget import forget_bias, forget_bias_naive, log_forget_cumsum
from posenc.errors import PosencError
from posenc.model import build_model


def test_tiles_equal_explicit_products_and_are_nonpositive():
    logits = torch.randn(2, 3, 17, dtype=torch.float64)
    tile = forget_bias(log_forget_cumsum(logits)).tile(0, 17, 0, 17).double()
    ref = forget_bias_naive(logits)
    causal = torch.ones(17, 17, dtype=torch.bool).tril()
    assert torch.allclose(tile[..., causal], ref[..., causal], atol=1e-6)
    assert float(tile.max()) <= 0.0
    # exp of the tile is the product of gates f_{j+1..i}
    f = torch.sigmoid(logits)
    assert tile[0, 0, 9, 4].exp().item() == pytest.approx(f[0, 0, 5:10].prod().item(), rel=1e-5)


@pytest.mark.parametrize("spec", ["forget", "acc-rand-qkv+forget"])
def test_chunked_path_equals_full_matrix_with_gradients(spec):
    dims = Dims(n_head=2, head_dim=8, d_model=16, vocab_size=256, train_length=16)
    enc = encodings.get(spec, dims).double()
    enc.eval()
    T = 29
    x = torch.randn(2, T, 16, dtype=torch.float64)
    inp = Inputs(x, torch.arange(T), torch.zeros(2, T, dtype=torch.long))
    q, k, v = (torch.randn(2, 2, T, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    bias = enc.bias(inp)
    phases = enc.phases(inp)
    fast = attention(q, k, v, bias=bias, phases=phases, rotate_v=enc.rotate_v, block_size=6)
    gate = enc.parts[1].gate if spec != "forget" else enc.gate
    leaves = (q, k, v, gate.weight)
    g_fast = torch.autograd.grad(fast.sum(), leaves)
    assert not torch.allclose(fast, attention(q, k, v, phases=phases, rotate_v=enc.rotate_v), atol=1e-3)
    if spec == "forget":
        ref_bias = forget_bias_naive(gate(x).transpose(1, 2))
        ref = naive_attention(q, k, v, bias=Bias(lambda *a: ref_bias))
        g_ref = torch.autograd.grad(ref.sum(), leaves)
        assert torch.allclose(fast, ref, atol=1e-6)
        for a, b in zip(g_fast, g_ref):
            assert torch.allclose(a, b, atol=1e-5)


def test_long_sequence_prefix_sums_stay_exact():
    T = 1_000_000
    logits = torch.full((1, 1, T), 6.0)  # f close to 1: small steps on a large running sum
    step = float(torch.nn.functional.logsigmoid(torch.tensor(6.0, dtype=torch.float64)))
    tile = forget_bias(log_forget_cumsum(logits)).tile(T - 1, T, T - 4, T)[0, 0, 0]  # near keys at the end
    assert torch.isfinite(tile).all() and float(tile.max()) <= 0
    assert tile.double().tolist() == pytest.approx([3 * step, 2 * step, step, 0.0], rel=1e-5, abs=1e-12)
    lam32 = torch.cumsum(torch.nn.functional.logsigmoid(logits), -1)[0, 0]  # what float32 sums would give
    assert abs(float(lam32[T - 1] - lam32[T - 4]) - 3 * step) > 0.01 * abs(3 * step)


def test_composite_model_weights_save_and_load(tmp_path):
    from posenc.model import build_model
    from posenc.store.checkpoint import load_weights, save_weights

    cfg = {"n_layer": 1, "n_head": 2, "d_model": 16, "train_length": 8, "encoding": "acc-rand-qkv+forget"}
    model = build_model(cfg)
    save_weights(tmp_path / "m.safetensors", model)  # the rotary part is stored once
    other = build_model(cfg)
    load_weights(tmp_path / "m.safetensors", other)
    assert torch.equal(other.blocks[0].attn.enc.parts[1].gate.weight, model.blocks[0].attn.enc.parts[1].gate.weight)


def test_init_bias_sets_the_gate_bias_and_keeps_the_random_draws():
    torch.manual_seed(0)
    plain = build_model({"encoding": "rope+forget", "n_layer": 2, "d_model": 32, "n_head": 2})
    torch.manual_seed(0)
    opened = build_model({"encoding": "rope+forget:init_bias=4", "n_layer": 2, "d_model": 32, "n_head": 2})
    a, b = plain.state_dict(), opened.state_dict()
    gate_biases = [k for k in b if k.endswith("gate.bias")]
    assert len(gate_biases) == 2 and all(torch.equal(b[k], torch.full((2,), 4.0)) for k in gate_biases)
    assert all(torch.equal(a[k], b[k]) for k in a if k not in gate_biases)
    assert "b starts at 4" in opened.blocks[0].attn.enc.describe()
    with pytest.raises(PosencError, match="init_bias=inf: must be a finite number"):
        build_model({"encoding": "forget:init_bias=inf"})
    with pytest.raises(PosencError, match=r"init_bias must lie in \[-30, 30\]"):
        build_model({"encoding": "rope+forget:init_bias=-31"})
