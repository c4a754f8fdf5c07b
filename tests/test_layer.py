"""posenc.Attention (the drop-in layer LM is built from), grouped-query attention, prepare/attend, the docs' example of
the layer in a block."""

import re
from pathlib import Path

import pytest
import torch

import posenc
from posenc.attention import attention, repeat_kv
from posenc.errors import PosencError
from posenc.model import Cache, build_model

LIBRARY = Path(__file__).resolve().parents[1] / "docs" / "library.md"  # "Use it in your own model"


def _decoded(layer, x, cut=6):
    cache = posenc.LayerCache()
    out = [layer(x[:, :cut], cache=cache)] + [layer(x[:, t : t + 1], cache=cache) for t in range(cut, x.shape[1])]
    heads = layer.n_head if cache.state is not None and cache.state.per_head_keys else layer.n_kv_head
    assert cache.length == x.shape[1] and not cache.reference and cache.k.shape[1] == heads
    return torch.cat(out, dim=1)


@pytest.mark.parametrize(
    "spec",
    [
        "acc-rand-qkv:a=1",
        "acc-learned-qkv",
        "rope",
        "alibi",
        "hybrid",
        "path",
        "path+forget",
        "pope",
        "xpos",
        "rope|nope",
    ],
)
@pytest.mark.parametrize("n_kv_head", [None, 1, 2])
def test_decode_with_a_layer_cache_equals_the_parallel_forward(spec, n_kv_head):
    torch.manual_seed(0)
    layer = posenc.Attention(32, 4, spec, n_kv_head=n_kv_head, train_length=16).double().eval()
    x = torch.randn(2, 14, 32, dtype=torch.float64)
    with torch.no_grad():
        assert (_decoded(layer, x) - layer(x)).abs().max().item() < 1e-10


def test_gqa_equals_full_attention_with_the_key_value_heads_repeated():
    """n_kv_head = 2 of 4: the output of a layer whose 4 key/value heads are copies h // 2 of the 2."""
    torch.manual_seed(1)
    gqa = posenc.Attention(32, 4, "rope", n_kv_head=2).double()
    full = posenc.Attention(32, 4, "rope").double()
    w = gqa.qkv.weight.view(8, 8, 32)  # heads: 4 q, 2 k, 2 v
    q, k, v = w[:4], w[4:6], w[6:]
    full.qkv.weight.data.copy_(torch.cat((q, k.repeat_interleave(2, 0), v.repeat_interleave(2, 0))).view(96, 32))
    full.proj.weight.data.copy_(gqa.proj.weight)
    assert gqa.qkv.weight.shape == (64, 32) and full.qkv.weight.shape == (96, 32)
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    assert torch.allclose(gqa(x), full(x), atol=1e-12, rtol=0)


def test_lm_layers_are_posenc_attention_and_old_checkpoint_keys_load():
    m = build_model({"n_layer": 2, "d_model": 32, "n_head": 4})
    assert all(type(b.attn) is posenc.Attention for b in m.blocks)
    keys = {k for k in m.state_dict() if k.startswith("blocks.0.attn.")}
    assert keys == {"blocks.0.attn.qkv.weight", "blocks.0.attn.proj.weight"}
    assert m.state_dict()["blocks.0.attn.qkv.weight"].shape == (96, 32)


def test_gqa_lm_decodes_as_its_parallel_forward():
    torch.manual_seed(2)
    m = build_model({"n_layer": 2, "d_model": 32, "n_head": 4, "n_kv_head": 1, "encoding": "hybrid"}).double().eval()
    x = torch.randint(0, 256, (2, 12))
    cache = posenc.model.Cache(2)
    with torch.no_grad():
        got = torch.cat([m.decode(x[:, :5], cache)] + [m.decode(x[:, t : t + 1], cache) for t in range(5, 12)], dim=1)
        assert (got - m(x)).abs().max().item() < 1e-10
    assert m.blocks[0].attn.qkv.weight.shape == ((4 + 2) * 8, 32)


def test_positions_shift_rope_outputs_only_through_relative_offsets():
    """RoPE depends on j - i only: positions 100.. give the output of positions 0.. ."""
    torch.manual_seed(3)
    layer = posenc.Attention(32, 4, "rope").double()
    x = torch.randn(1, 10, 32, dtype=torch.float64)
    shifted = layer(x, torch.arange(100, 110))
    assert torch.allclose(shifted, layer(x), atol=1e-10) and not torch.allclose(
        layer(x, torch.arange(10) * 3), layer(x), atol=1e-3
    )


def test_prepare_attend_equals_the_core_and_the_module():
    torch.manual_seed(4)
    x, q, k, v = torch.randn(2, 11, 32), torch.randn(2, 4, 11, 8), torch.randn(2, 2, 11, 8), torch.randn(2, 2, 11, 8)
    p = posenc.prepare("alibi", x, n_head=4)
    ref = attention(q, repeat_kv(k, 4), repeat_kv(v, 4), bias=p.bias)
    assert p.phases is None and p.bias is not None
    assert torch.allclose(posenc.attend(q, k, v, p), ref, atol=1e-6)
    suffix = posenc.attend(q[:, :, -3:], k, v, p)  # decoding: the last 3 queries over all keys
    assert torch.allclose(suffix, ref[:, :, -3:], atol=1e-6)
    layer = posenc.Attention(32, 4, "rope").eval()
    qq, kk, vv = layer.project(x)
    out = posenc.attend(qq, kk, vv, posenc.prepare(layer.enc, x))
    assert torch.allclose(layer.proj(out.transpose(1, 2).reshape(2, 11, 32)), layer(x), atol=1e-6)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: posenc.Attention(30, 4), "^d_model 30 is not divisible by n_head 4$"),
        (lambda: posenc.Attention(32, 4, n_kv_head=3), "^n_head 4 is not divisible by n_kv_head 3$"),
        (lambda: posenc.Attention(32, 4, "sinusoidal"), "additive input embedding"),
        (lambda: posenc.Attention(32, 4, "nosuch"), "unknown scheme"),
        (lambda: posenc.Attention(32, 4)(torch.randn(2, 5, 16)), r"x must be \(batch, T, 32\)"),
        (lambda: posenc.Attention(32, 4)(torch.randn(2, 5, 32), torch.arange(4)), r"positions must be \(5,\) int64"),
        (lambda: posenc.Attention(32, 4)(torch.randn(2, 5, 32), torch.arange(5.0)), "int64"),
        (lambda: posenc.Attention(32, 4, "acc-token-qkv", vocab_size=16)(torch.randn(2, 5, 32)), "need the token ids"),
        (lambda: posenc.prepare("forget", torch.randn(1, 5, 32), n_head=4), "learned parameters"),
        (lambda: posenc.prepare("alibi", torch.randn(1, 5, 32)), "needs n_head"),
        (
            lambda: posenc.attend(
                torch.randn(1, 4, 5, 8),
                torch.randn(1, 3, 5, 8),
                torch.randn(1, 3, 5, 8),
                posenc.prepare("alibi", torch.randn(1, 5, 32), n_head=4),
            ),
            "do not divide",
        ),
        *[
            (
                lambda spec=spec: posenc.attend(
                    *torch.randn(3, 1, 2, 6, 16), posenc.prepare(spec, torch.randn(1, 6, 16), n_head=2)
                ),
                "^q, k have head dim 16, 16; the scheme was prepared for head dim 8$",
            )
            for spec in ("rope", "xpos", "alibi", "nope")
        ],
        (
            lambda: posenc.attend(
                *torch.randn(3, 1, 2, 6, 8), posenc.prepare("rope", torch.randn(1, 6, 16), n_head=2, head_dim=4)
            ),
            "^q, k have head dim 8, 8; the scheme was prepared for head dim 4$",
        ),
        (
            lambda: posenc.attend(
                torch.randn(1, 2, 6, 8),
                torch.randn(1, 2, 6, 8),
                torch.randn(1, 2, 6, 4),
                posenc.prepare("acc-rand-qkv:a=1", torch.randn(1, 6, 16), n_head=2),
            ),
            "^q, k, v have head dim 8, 8, 4; the scheme was prepared for head dim 8$",
        ),
        (
            lambda: posenc.attend(
                *torch.randn(3, 1, 4, 6, 8), posenc.prepare("alibi", torch.randn(1, 6, 16), n_head=2)
            ),
            "^q has 4 heads; the scheme was prepared for 2$",
        ),
    ],
)
def test_bad_input_raises_one_line_posenc_error(call, message):
    with pytest.raises(PosencError, match=message) as exc:
        call()
    assert "\n" not in str(exc.value)


def test_partial_rotary_declared_by_the_scheme_attends_at_the_full_head_dim():
    torch.manual_seed(6)
    x, (q, k, v) = torch.randn(1, 6, 16), torch.randn(3, 1, 2, 6, 8)
    p = posenc.prepare("rope:rotary_fraction=0.5", x, n_head=2)
    assert p.phases.shape[-1] == 2  # 4 of 8 features rotate
    assert torch.allclose(posenc.attend(q, k, v, p), attention(q, k, v, phases=p.phases), atol=1e-6)


def test_cache_refuses_another_batch_size():
    layer, cache = posenc.Attention(32, 4, "rope"), posenc.LayerCache()
    layer(torch.randn(2, 3, 32), cache=cache)
    with pytest.raises(PosencError, match="batch size 2"):
        layer(torch.randn(3, 1, 32), cache=cache)


@pytest.mark.parametrize(
    "other",
    [
        lambda: posenc.Attention(32, 4, "rope"),  # the same scheme: decoded 0.27 off the forward
        lambda: posenc.Attention(32, 4, "alibi"),  # another scheme: a bare AssertionError
        lambda: posenc.Attention(32, 2, "rope"),  # other head counts: a raw RuntimeError
        lambda: posenc.Attention(32, 4, "rope", n_kv_head=1),
    ],
    ids=["same-scheme", "other-scheme", "other-heads", "other-kv-heads"],
)
def test_a_layer_cache_belongs_to_the_layer_that_filled_it(other):
    torch.manual_seed(7)
    first, x = posenc.Attention(32, 4, "rope").eval(), torch.randn(2, 6, 32)
    cache = posenc.LayerCache()
    first(x[:, :5], cache=cache)
    with pytest.raises(PosencError) as exc:
        other().eval()(x[:, 5:], cache=cache)
    assert str(exc.value) == (
        "this LayerCache holds another layer's keys and scheme state: give each layer its own LayerCache"
    )
    assert cache.length == 5  # untouched: its own layer goes on
    with torch.no_grad():
        assert torch.allclose(first(x[:, 5:], cache=cache), first(x)[:, 5:], atol=1e-5)


def test_an_lm_cache_belongs_to_the_model_that_filled_it():
    a, b = (build_model({"encoding": "rope", "n_layer": 2, "d_model": 32, "n_head": 4}).eval() for _ in range(2))
    cache, ids = Cache(2), torch.randint(0, 256, (1, 6))
    a.decode(ids[:, :5], cache)
    with pytest.raises(PosencError, match="^this LayerCache holds another layer's keys"):
        b.decode(ids[:, 5:], cache)


def test_token_schemes_take_token_ids():
    torch.manual_seed(5)
    layer = posenc.Attention(32, 4, "acc-token-qkv", vocab_size=16).double()
    x, tok = torch.randn(1, 6, 32, dtype=torch.float64), torch.randint(0, 16, (1, 6))
    assert not torch.allclose(layer(x, tokens=tok), layer(x, tokens=(tok + 1) % 16))


def test_the_docs_block_example_runs_verbatim():
    code = re.search(r"```python\n(.*?)```", LIBRARY.read_text(), re.S).group(1)
    assert "posenc.Attention(" in code and "LayerCache" in code
    namespace = {}
    exec(compile(code, str(LIBRARY), "exec"), namespace)
    assert namespace["steps"].shape == (2, 16, 64)


@pytest.mark.parametrize("spec", ["path+forget", "pope+alibi"])
def test_a_composite_that_replaces_attention_computes_the_other_parts_bias_once(spec):
    torch.manual_seed(0)
    layer = posenc.Attention(32, 4, spec, train_length=16).double().eval()
    part = next(p for p in layer.enc.parts if p.has_bias)
    calls, bias = [], part.bias
    part.bias = lambda inp: calls.append(1) or bias(inp)
    x = torch.randn(2, 10, 32, dtype=torch.float64)
    out = layer(x)
    assert len(calls) == 1
    part.bias = bias
    q, k, v = layer.project(x)  # the composite alone, bias computed from its parts: the same output
    direct = layer.enc.attend(q, k, v, posenc.layer.Inputs(x, torch.arange(10)))
    assert torch.allclose(out, layer.proj(direct.transpose(1, 2).reshape(2, 10, 32)), atol=1e-12)
