"""FIRE, CoPE and DAPE: blockwise paths against full-matrix references (values and gradients,
float64), causality, parameter errors, and tiny models that train."""

import math
import warnings

import pytest
import torch

from posenc import build_model, encodings
from posenc.attention import Bias, attention, naive_attention
from posenc.encodings import fire as fire_module
from posenc.encodings.base import Dims, Inputs
from posenc.encodings.bias import alibi_slopes
from posenc.encodings.cope import cope_attention_naive, cope_logits
from posenc.encodings.dape import dape_attention_naive
from posenc.encodings.fire import fire_bias_naive
from posenc.encodings.mlp import PointMLP
from posenc.encodings.relative import relative_bias_naive
from posenc.errors import PosencError

DIMS = Dims(n_head=3, head_dim=8, d_model=24, vocab_size=256, train_length=16)
POS = [0, 1, 2, 3, 5, 8, 9, 20, 47, 48, 130, 131, 400]  # gaps: FIRE's threshold and log regimes
T = len(POS)


def _inputs():
    return Inputs(torch.zeros(1, T, 24), torch.tensor(POS), torch.zeros(1, T, dtype=torch.int64))


def _qkv(requires_grad=True):
    g = torch.Generator().manual_seed(1)
    return [torch.randn(2, 3, T, 8, dtype=torch.float64, generator=g).requires_grad_(requires_grad) for _ in range(3)]


POSITIVE = ("c", "L_multiplier", "r1", "r2")  # used as |c|, |m| L0, clamped >= 1e-2: keep away from 0


def _random(enc):
    """The module in float64 with random parameters (CoPE's table starts at 0, FIRE's MLP at small values)."""
    enc = enc.double()
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in enc.named_parameters():
            if name.endswith(POSITIVE):
                p.copy_(torch.rand(p.shape, generator=g, dtype=torch.float64) * 1.5 + 0.05)
            else:
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64))
    return enc


def _alibi_naive(pos=POS, n_head=3):
    """-m_h (i - j) for every pair, (1, H, T, T) float64."""
    p = torch.tensor(pos, dtype=torch.float64)
    return -alibi_slopes(n_head)[None, :, None, None] * (p[:, None] - p[None, :])


def _tiles(full):
    return Bias(lambda qs, qe, ks, ke: full[..., qs:qe, ks:ke])


def _assert_same(fast, ref, inputs, tol=1e-7):
    """Values and the gradients of sum(out^2) with respect to ``inputs`` agree."""
    torch.testing.assert_close(fast, ref, rtol=tol, atol=tol)
    g_fast = torch.autograd.grad(fast.square().sum(), inputs)
    g_ref = torch.autograd.grad(ref.square().sum(), inputs)
    for a, b in zip(g_fast, g_ref):
        torch.testing.assert_close(a, b, rtol=10 * tol, atol=10 * tol)


CAUSAL = torch.ones(T, T, dtype=torch.bool).tril()


# ---------------------------------------------------------------- FIRE


def test_fire_tiles_equal_the_explicit_loop(monkeypatch):
    monkeypatch.setattr(fire_module, "KEY_CHUNK", 4)  # several MLP chunks per tile
    enc = _random(encodings.get("fire", DIMS))
    bias = enc.bias(_inputs())
    full = bias.tile(0, T, 0, T)
    assert full.shape == (1, 3, T, T) and full.dtype == torch.float64
    torch.testing.assert_close(full[..., CAUSAL], fire_bias_naive(enc, POS)[..., CAUSAL])
    torch.testing.assert_close(bias.tile(4, 9, 2, 7), full[..., 4:9, 2:7])  # any tile is a slice


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fire_tiles_without_grad_take_the_piecewise_form_and_equal_the_mlp(dtype, monkeypatch):
    """Evaluation tiles (no grad) come from the MLP's knots and segment table (``PointMLP.piecewise``); they equal
    the MLP's tiles (the path with grad) to rounding, on random weights and positions up to 400."""
    monkeypatch.setattr(fire_module, "KEY_CHUNK", 4)
    enc = _random(encodings.get("fire", DIMS)).to(dtype)
    bias = enc.bias(_inputs())
    called = []
    monkeypatch.setattr(enc.mlp, "piecewise", lambda dt, f=enc.mlp.piecewise: called.append(dt) or f(dt))
    with torch.no_grad():
        fast = bias.tile(0, T, 0, T)
    assert called == [dtype] and fast.dtype == dtype
    mlp = bias.tile(0, T, 0, T).detach()  # grad enabled: the MLP
    torch.testing.assert_close(fast, mlp, rtol=0, atol=1e-12 if dtype == torch.float64 else 2e-6)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fire_long_forwards_take_the_compiled_kernel_equal_to_the_eager_form(dtype, monkeypatch):
    """From COMPILE_FROM positions an evaluation tile is ``piecewise_bias`` compiled (one kernel): the eager
    function's values to rounding, and the explicit loop's."""
    enc = _random(encodings.get("fire", DIMS)).to(dtype)
    compiled = fire_module.compiled_piecewise_bias()
    calls = []
    monkeypatch.setattr(fire_module, "compiled_piecewise_bias", lambda: lambda *a: calls.append(1) or compiled(*a))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("error", message="FIRE tiles run eager")  # a fallback would not test the kernel
        eager = enc.bias(_inputs()).tile(0, T, 0, T)  # T < COMPILE_FROM: eager
        assert not calls
        monkeypatch.setattr(fire_module, "COMPILE_FROM", T)
        fast = enc.bias(_inputs()).tile(2, T, 1, T)  # a tile off the origin
    assert calls == [1] and fast.dtype == dtype and fast.is_contiguous()
    tol = 1e-12 if dtype == torch.float64 else 2e-6  # inductor's vectorised log1p may round otherwise than ATen's
    torch.testing.assert_close(fast, eager[..., 2:, 1:], rtol=0, atol=tol)
    torch.testing.assert_close(
        fast[..., CAUSAL[2:, 1:]],
        fire_bias_naive(enc, POS)[..., 2:, 1:][..., CAUSAL[2:, 1:]].to(dtype),
        rtol=0,
        atol=tol,
    )


def test_fire_tiles_fall_back_to_eager_where_torch_compile_fails(monkeypatch):
    """A machine inductor cannot compile on (no C++ compiler) gets the eager function's tiles and one warning."""

    def no_compiler(fn, **kwargs):
        def call(*args):
            raise torch._dynamo.exc.BackendCompilerFailed(fn, RuntimeError("no C++ compiler"), None)

        return call

    monkeypatch.setattr(torch, "compile", no_compiler)
    fire_module.compiled_piecewise_bias.cache_clear()
    try:
        run = fire_module.compiled_piecewise_bias()
        p = torch.tensor(POS, dtype=torch.float64)
        enc = _random(encodings.get("fire", DIMS))
        args = (p[:, None], p[None, :], *enc.coefficients(), *enc.mlp.piecewise(torch.float64))
        with pytest.warns(UserWarning, match=r"FIRE tiles run eager: torch.compile failed \(.*no C\+\+ compiler"):
            first = run(*args)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            again = run(*args)  # the eager function from then on, said once
        assert torch.equal(first, fire_module.piecewise_bias(*args)) and torch.equal(again, first)
    finally:
        fire_module.compiled_piecewise_bias.cache_clear()  # the next caller compiles for real


@pytest.mark.parametrize("act", ["relu", "leaky_relu"])
def test_a_point_mlp_of_one_input_is_its_piecewise_form(act):
    mlp = PointMLP(1, 16, 3, act)
    with torch.no_grad():
        mlp.b1.mul_(4)  # knots spread over [-4, 4] and beyond
    x = torch.linspace(-30, 30, 5001, dtype=torch.float64)
    knots, table = mlp.piecewise(torch.float64)
    assert knots.shape == (16,) and table.shape == (17, 6) and bool((knots.diff() >= 0).all())
    s = torch.bucketize(x, knots)
    with torch.no_grad():
        tol = 1e-12 if act == "relu" else 1e-8  # F.leaky_relu rounds its slope 0.01 to float32 (2e-8 relative)
        torch.testing.assert_close(table[s, :3] * x[:, None] + table[s, 3:], mlp(x[:, None]), rtol=0, atol=tol)
    with pytest.raises(ValueError, match="one input"):
        PointMLP(2, 4, 1, "relu").piecewise(torch.float64)


def test_fire_interpolates_long_distances_into_the_unit_interval():
    enc = encodings.get("fire", DIMS)  # L = 16 / 4 = 4 at init
    full = enc.bias(_inputs()).tile(0, T, 0, T)
    assert full.dtype == torch.float32
    x_one = enc.mlp(torch.ones(1, 1))[0]  # f(1): psi(i - 0) / psi(max(L, i)) = 1 once i >= L
    for i in (5, 10, 12):  # positions 8, 130, 400
        torch.testing.assert_close(full[0, :, i, 0], x_one, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(full[0, :, 3, 3], enc.mlp(torch.zeros(1, 1))[0])  # i = j: f(0)


@pytest.mark.parametrize("block", [1, 5, 64])
def test_fire_attention_equals_full_matrix_with_gradients(block, monkeypatch):
    monkeypatch.setattr(fire_module, "KEY_CHUNK", 3)
    enc = _random(encodings.get("fire", DIMS))
    q, k, v = _qkv()
    fast = attention(q, k, v, bias=enc.bias(_inputs()), block_size=block)
    ref = naive_attention(q, k, v, bias=_tiles(fire_bias_naive(enc, POS)))
    _assert_same(fast, ref, [q, k, v, *enc.parameters()])


def test_fire_mlp_keeps_its_default_init_in_a_model():
    model = build_model({"encoding": "fire", "n_layer": 1, "n_head": 2, "d_model": 16, "train_length": 8})
    w1 = model.blocks[0].attn.enc.mlp.w1  # U(-1, 1) (fan-in 1), not the model's N(0, 0.02^2)
    assert float(w1.detach().abs().max()) > 0.3


# ---------------------------------------------------------------- CoPE


@pytest.mark.parametrize("npos,block", [(5, 1), (5, 5), (20, 64), (2, 4)])
def test_cope_attention_equals_full_matrix_with_gradients(npos, block):
    enc = _random(encodings.get("cope", DIMS, npos_max=npos, block_size=block))
    q, k, v = _qkv()
    fast = enc.attend(q, k, v, _inputs())
    ref = cope_attention_naive(q, k, v, enc.pos_emb)
    _assert_same(fast, ref, [q, k, v, enc.pos_emb])
    assert not torch.allclose(fast, naive_attention(q, k, v), atol=1e-3)  # the position term is there


def test_cope_in_a_composition_takes_the_other_bias():
    enc = _random(encodings.get("cope:npos_max=6,block_size=5+alibi", DIMS))
    q, k, v = _qkv()
    fast = enc.attend(q, k, v, _inputs())
    ref = cope_attention_naive(q, k, v, enc.parts[0].pos_emb, bias=_tiles(_alibi_naive()))
    _assert_same(fast, ref, [q, k, v, enc.parts[0].pos_emb])


def test_cope_starts_as_nope_and_keeps_float32_positions():
    enc = encodings.get("cope", DIMS)
    q, k, v = (t.detach() for t in _qkv())
    torch.testing.assert_close(enc.double().attend(q, k, v, _inputs()), naive_attention(q, k, v))
    one = _random(encodings.get("cope:npos_max=1", DIMS))  # every position clipped to 0: a shift per query
    torch.testing.assert_close(one.attend(q, k, v, _inputs()), naive_attention(q, k, v))
    logits = cope_logits(q.bfloat16(), k.bfloat16(), enc.pos_emb.bfloat16(), 0, T, 0.3)
    assert logits.dtype == torch.float32


# ---------------------------------------------------------------- DAPE


@pytest.mark.parametrize("spec", ["dape", "dape-kerple"])
@pytest.mark.parametrize("block", [2, 5, 64])  # block 1: 91 tiles, 5 s for no new case
def test_dape_attention_equals_full_matrix_with_gradients(spec, block):
    enc = _random(encodings.get(spec, DIMS, block_size=block))
    q, k, v = _qkv()
    fast = enc.attend(q, k, v, _inputs())
    base = _alibi_naive() if enc.base_name == "alibi" else relative_bias_naive(enc.base, POS)
    ref = dape_attention_naive(q, k, v, enc, base)
    _assert_same(fast, ref, [q, k, v, *enc.parameters()], tol=1e-5)  # ALiBi and Kerple tiles are float32
    plain = naive_attention(q, k, v, bias=_tiles(base))
    assert not torch.allclose(fast, plain, atol=1e-3)  # the MLP term is there


def test_dape_in_a_composition_feeds_the_other_bias_to_the_mlp():
    enc = _random(encodings.get("dape:block_size=5+t5", DIMS))
    q, k, v = _qkv()
    fast = enc.attend(q, k, v, _inputs())
    dape, t5 = enc.parts
    ref = dape_attention_naive(q, k, v, dape, _alibi_naive() + relative_bias_naive(t5, POS))
    _assert_same(fast, ref, [q, k, v, *enc.parameters()], tol=1e-5)


# ---------------------------------------------------------------- all three

SPECS = [
    "fire",
    "cope:block_size=4",
    "dape:block_size=4",
    "dape-kerple",
    "cope:block_size=4+alibi",
    "dape:block_size=4+t5",
]


@pytest.mark.parametrize("spec", SPECS)
def test_future_tokens_do_not_change_earlier_outputs(spec):
    torch.manual_seed(0)
    model = build_model(
        {"encoding": spec, "n_layer": 2, "n_head": 2, "d_model": 16, "train_length": 8, "attn_block_size": 4}
    ).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("pos_emb"):  # CoPE's table starts at 0: give the gates something to move
                p.normal_()
    tokens = torch.randint(0, 256, (2, 11))
    other = tokens.clone()
    other[:, 6:] = (other[:, 6:] + 1 + torch.randint(0, 254, (2, 5))) % 256
    with torch.no_grad():
        a, b = model(tokens), model(other)
    torch.testing.assert_close(a[:, :6], b[:, :6])
    assert not torch.allclose(a[:, 6:], b[:, 6:])


@pytest.mark.parametrize(
    "spec,message",
    [
        ("fire:mlp_width=0", r"fire needs mlp_width >= 1, init_c > 0 and init_L > 0, got 0, 0.1, 4.0"),
        ("fire:init_c=0", r"got 32, 0, 4.0"),
        ("fire:init_L=-1", r"got 32, 0.1, -1.0"),
        ("cope:npos_max=0", r"cope needs npos_max >= 1 and block_size >= 1, got 0, 512"),
        ("cope:block_size=0", r"got 64, 0"),
        ("cope:npos_max=2.5", r"npos_max=2.5: expected int"),
        ("dape:base=rope", r"dape base must be 'alibi' or 'kerple', got 'rope'"),
        ("dape:mlp_width=0", r"dape needs mlp_width >= 1 and block_size >= 1, got 0, 512"),
        ("dape-kerple:base=alibi", r"'dape-kerple' fixes base='kerple'"),
    ],
)
def test_bad_parameters_are_one_line_errors(spec, message):
    with pytest.raises(PosencError, match=message) as err:
        encodings.get(spec, DIMS)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("spec", SPECS)
def test_models_train(spec):
    torch.manual_seed(0)
    model = build_model({"encoding": spec, "n_layer": 1, "n_head": 2, "d_model": 16, "train_length": 8})
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    tokens = torch.randint(0, 256, (4, 12))
    losses = []
    for _ in range(4):
        loss = model.token_nll(tokens[:, :-1], tokens[:, 1:]).mean()
        opt.zero_grad()
        loss.backward()
        grads = [p.grad for n, p in model.named_parameters() if ".enc." in n]
        assert grads and all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]


@pytest.mark.parametrize("spec", ["fire", "cope", "dape"])
def test_bf16_models_keep_float32_positions(spec):
    model = build_model({"encoding": spec, "n_layer": 1, "n_head": 2, "d_model": 16, "train_length": 8}).to(
        torch.bfloat16
    )
    enc = model.blocks[0].attn.enc
    if spec == "fire":  # bf16 parameters, autocast on: psi and the MLP still run in float32
        assert enc.c.dtype == torch.bfloat16
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert enc.bias(Inputs(None, torch.arange(20), None)).tile(0, 20, 0, 20).dtype == torch.float32
    with torch.no_grad():
        nll = model.token_nll(*torch.randint(0, 256, (2, 2, 11)))
    assert nll.dtype == torch.float32 and torch.isfinite(nll).all()
