"""Local/global layers (issue 60): sliding-window and chunked attention on any scheme (``window=`` / ``chunk=``),
the named patterns ``gemma3``, ``rnope-swa`` and ``irope-shipped``, checked against the definitions, transformers'
mask functions and its Gemma 3 and Llama 4 attention layers; decoding equal to the forward with a bounded cache,
grouped-query attention, padded batches, and the one-line refusals."""

import dataclasses
import math
import re

import pytest
import torch
import transformers
from transformers import Gemma3TextConfig, Gemma3TextModel, Llama4TextConfig, Llama4TextModel
from transformers.masking_utils import chunked_causal_mask_function, sliding_window_causal_mask_function

import posenc.attention as core
from posenc import Attention, LayerCache, encodings
from posenc.attention import Bias, Window, attention, naive_attention
from posenc.cli.main import main
from posenc.encodings.base import Dims
from posenc.errors import PosencError
from posenc.layer import attend, prepare
from posenc.model import Cache, build_model, pad_left, set_method
from tests.decoding import assert_grouped_query_decoding_equals_the_parallel_forward

WINDOWS = [Window(1), Window(5), Window(7, chunked=True), Window(4, chunked=True), Window(60)]


def hf_mask(fn, B: int, T: int) -> torch.Tensor:
    """(B, 1, T, T) bool: transformers' mask function evaluated at every (batch, query, key), broadcast."""
    b, i, j = torch.arange(B)[:, None, None, None], torch.arange(T)[:, None], torch.arange(T)[None]
    return fn(b, torch.zeros((), dtype=torch.int64), i, j).expand(B, 1, T, T)


@pytest.mark.parametrize("size", [1, 3, 8])
def test_the_sliding_window_is_transformers_sliding_window_mask(size):
    T = 20
    want = hf_mask(sliding_window_causal_mask_function(size), 1, T)
    assert torch.equal(Window(size).keep(0, T, 0, T, "cpu"), want)
    # a decoding step's frame: keys from a cache that dropped 6 rows, queries the last 4 of 14 held rows
    assert torch.equal(Window(size, offset=6).keep(10, 14, 0, 14, "cpu"), want[..., 16:20, 6:20])


@pytest.mark.parametrize("size", [1, 3, 8])
def test_chunks_are_transformers_chunked_mask_counted_from_each_rows_padding(size):
    T, first = 20, torch.tensor([0, 3, 7])
    want = hf_mask(chunked_causal_mask_function(size, first), 3, T)
    assert torch.equal(Window(size, chunked=True, first=first).keep(0, T, 0, T, "cpu"), want)
    unpadded = hf_mask(chunked_causal_mask_function(size, torch.zeros(1, dtype=torch.int64)), 1, T)
    assert torch.equal(Window(size, chunked=True).keep(0, T, 0, T, "cpu"), unpadded)
    window = Window(size, chunked=True, offset=5, first=first)
    assert torch.equal(window.keep(12, 15, 2, 15, "cpu"), want[..., 17:20, 7:20])


@pytest.mark.parametrize("window", WINDOWS, ids=lambda w: w.describe())
def test_the_blockwise_core_equals_the_naive_definition(window):
    """Values and gradients (to q, k, v and a bias's parameter) of query blocks smaller and larger than the window."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 37, 8, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(3))
    slope = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)

    def bias(qs, qe, ks, ke):
        return -slope * (torch.arange(qs, qe)[:, None] - torch.arange(ks, ke)[None]).abs().double()[None, None]

    for block, b in ((8, None), (5, Bias(bias)), (64, Bias(bias))):
        fast = attention(q, k, v, bias=b, window=window, block_size=block)
        ref = naive_attention(q, k, v, bias=b, window=window)
        assert (fast - ref).abs().max() < 1e-12
        inputs = (q, k, v, slope) if b else (q, k, v)
        g_fast = torch.autograd.grad(fast.square().sum(), inputs)
        g_ref = torch.autograd.grad(ref.square().sum(), inputs)
        assert all((a - r).abs().max() < 1e-10 for a, r in zip(g_fast, g_ref))
    if window.size < 37:  # the window changes the attention at this length
        assert (naive_attention(q, k, v) - naive_attention(q, k, v, window=window)).abs().max() > 1e-2


def test_a_long_windowed_forward_holds_one_block_of_scores_at_a_time(monkeypatch):
    """T = 600, window 16, blocks of 64: every SDPA call sees at most 64 queries over 64 + 15 keys (never T x T)."""
    shapes, sdpa = [], core.F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        shapes.append((q.shape[-2], k.shape[-2], tuple(kw["attn_mask"].shape[-2:])))
        return sdpa(q, k, v, **kw)

    monkeypatch.setattr(core.F, "scaled_dot_product_attention", spy)
    q = torch.randn(1, 2, 600, 8)
    attention(q, q, q, window=Window(16), block_size=64)
    assert len(shapes) == 10 and max(s[1] for s in shapes) == 64 + 15
    assert all(mask == (nq, nk) for nq, nk, mask in shapes)


def capture(model, T: int) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's attention input (normalised hidden states) and output (after o_proj), for 2 random rows of T."""
    seen = {}
    hooks = [
        layer.self_attn.register_forward_hook(
            lambda m, args, kw, out, i=i: seen.__setitem__(i, (kw["hidden_states"], out[0])), with_kwargs=True
        )
        for i, layer in enumerate(model.layers)
    ]
    ids = torch.randint(0, model.config.vocab_size, (2, T), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    return seen


def posenc_layer(att, x: torch.Tensor, spec: str, layer: int, scale: float, norms=None) -> torch.Tensor:
    """transformers attention module ``att``'s projections (and q/k norms) around posenc's attention of ``spec`` at
    layer index ``layer`` (4 heads of 8, 2 key/value heads), logits times ``scale``: (B, T, d)."""
    B, T, _ = x.shape
    q, k, v = (proj(x).view(B, T, -1, 8).transpose(1, 2) for proj in (att.q_proj, att.k_proj, att.v_proj))
    if norms is not None:
        q, k = norms[0](q.transpose(1, 2)).transpose(1, 2), norms[1](k.transpose(1, 2)).transpose(1, 2)
    enc = encodings.get(spec, Dims(4, 8, 32, 50, 64, layer)).double()
    out = attend(q, k, v, dataclasses.replace(prepare(enc, x), logit_scale=scale * math.sqrt(8)))
    return att.o_proj(out.transpose(1, 2).reshape(B, T, -1))


def tiny_gemma3(**extra) -> Gemma3TextConfig:
    """A 6-layer eager Gemma 3 (sliding_window 4, 2 key/value heads, head dim 8) with ``extra`` settings."""
    cfg = Gemma3TextConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        sliding_window=4,
        query_pre_attn_scalar=8,
        max_position_embeddings=64,
        **extra,
    )
    cfg._attn_implementation = "eager"
    return cfg


def test_gemma3_equals_transformers_gemma3_attention_layer_by_layer():
    """A 6-layer Gemma 3 (sliding_window 4, 2 key/value heads): each layer's attention equals posenc's
    ``gemma3:window=4`` entry of that layer (5 local layers at base 10K, then a global one at 1M) with the layer's
    q/k norms and query_pre_attn_scalar; 13 tokens, so the window matters."""
    cfg = tiny_gemma3()
    torch.manual_seed(0)
    model = Gemma3TextModel(cfg).double().eval()
    seen = capture(model, 13)
    assert cfg.layer_types == ["sliding_attention"] * 5 + ["full_attention"]
    for i, layer in enumerate(model.layers):
        att, (x, want) = layer.self_attn, seen[i]
        got = posenc_layer(att, x, "gemma3:window=4", i, att.scaling, (att.q_norm, att.k_norm))
        assert (got - want).abs().max() < 1e-7, i
        other = "rope:rope_theta=1000000" if i < 5 else "rope:rope_theta=10000,window=4"
        assert (posenc_layer(att, x, other, i, att.scaling, (att.q_norm, att.k_norm)) - want).abs().max() > 1e-4


def test_llama4_as_shipped_equals_transformers_llama4_attention_layer_by_layer():
    """A 4-layer Llama 4 text model (attention_chunk_size 4, temperature tuning with floor_scale 3, attn_scale 0.5,
    no qk-norm): layers 0-2 equal posenc's chunked RoPE (base 500K, adjacent pairs), layer 3 its NoPE with
    ``llama4-temp`` over every key; ``irope-shipped:chunk=4`` is that pattern with Llama 4's own temperature."""
    cfg = Llama4TextConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        intermediate_size_mlp=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        attention_chunk_size=4,
        floor_scale=3,
        attn_scale=0.5,
        use_qk_norm=False,
        num_local_experts=1,
        max_position_embeddings=64,
    )
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = Llama4TextModel(cfg).double().eval()
    seen = capture(model, 13)
    rope, temp = "rope:rope_theta=500000,pairing=adjacent,chunk=4", "llama4-temp:floor_scale=3,attn_scale=0.5"
    for i, layer in enumerate(model.layers):
        att, (x, want) = layer.self_attn, seen[i]
        assert (posenc_layer(att, x, f"{rope}|{rope}|{rope}|{temp}", i, att.scaling) - want).abs().max() < 1e-8, i
        unchunked = "rope:rope_theta=500000,pairing=adjacent" if i < 3 else "nope"
        assert (posenc_layer(att, x, unchunked, i, att.scaling) - want).abs().max() > 1e-4
    assert encodings.layer_pattern("irope-shipped:chunk=4") == [rope, rope, rope, "llama4-temp"]
    shipped = Llama4TextConfig()
    assert (shipped.attention_chunk_size, shipped.rope_parameters["rope_theta"]) == (8192, 500000.0)
    assert [bool(u) for u in shipped.no_rope_layers[:4]] == [True, True, True, False]


def test_the_named_patterns():
    assert encodings.layer_pattern("gemma3") == ["rope:rope_theta=10000,window=1024"] * 5 + [
        "rope:rope_theta=1000000,factor=1"
    ]
    assert encodings.layer_pattern("rnope-swa:window=16") == ["rope:window=16"] * 3 + ["nope"]
    assert encodings.layer_pattern("irope") == ["rope", "rope", "rope", "nope"]  # unchanged: committed results use it
    assert encodings.canonical("rope:window=8") != encodings.canonical("rope")
    assert encodings.canonical("rope:window=8") == encodings.canonical("rope:rope_theta=10000,window=8")


def test_posenc_list_shows_the_patterns_with_their_sources(capsys):
    """Each named pattern with its source, as a scheme's (an alias carried none)."""
    assert main(["list"]) == 0
    mixes = next(g for g in capsys.readouterr().out.split("\n\n") if g.startswith("per-layer mixes:"))
    for name, source in (
        ("gemma3", "[Gemma Team 2025, arXiv:2503.19786, sec. 2 (Gemma 3)]"),
        ("rnope-swa", "[Yang et al. 2025 (Cohere), arXiv:2501.18795 (RNoPE-SWA)]"),
        ("irope-shipped", "[Meta Llama 4 (transformers models/llama4)]"),
        ("irope", "[Meta Llama 4 (iRoPE)]"),
    ):
        line = next(line for line in mixes.splitlines() if line.startswith(f"  {name} "))
        assert line.endswith(source), line


SPECS = ["rope:window=3", "rope:chunk=4+alibi", "alibi:window=2", "acc-rand-qkv:window=4", "forget:chunk=3"]


@pytest.mark.parametrize("spec", SPECS)
def test_grouped_query_decoding_equals_the_parallel_forward(spec):
    assert_grouped_query_decoding_equals_the_parallel_forward(spec)


@pytest.mark.parametrize("spec", ["gemma3:window=3", "irope-shipped:chunk=4", "rnope-swa:window=5"])
def test_a_model_decodes_its_forward_with_a_bounded_cache(spec):
    """A model of one pattern's layers (2 key/value heads: gemma3's 6, the others' 4) fed 3 prompt tokens then one at a
    time up to 40: the logits equal the forward's; a windowed layer holds at most W - 1 keys after every step (its
    bytes flat), a global one all."""
    torch.manual_seed(0)
    n_layer = len(encodings.layer_pattern(spec))
    m = build_model(
        {"encoding": spec, "n_layer": n_layer, "n_head": 4, "n_kv_head": 2, "d_model": 32, "vocab_size": 50}
    ).double()
    m.eval()
    ids = torch.randint(0, 50, (2, 40))
    cache, steps, sizes = Cache(n_layer), [], []
    with torch.no_grad():
        steps.append(m.decode(ids[:, :3], cache))
        for t in range(3, 40):
            steps.append(m.decode(ids[:, t : t + 1], cache))
            sizes.append([(layer._k.length, layer.nbytes()) for layer in cache.layers])
        assert (torch.cat(steps, dim=1) - m(ids)).abs().max() < 1e-10
    for i, block in enumerate(m.blocks):
        window = block.attn.enc.window
        held = [s[i][0] for s in sizes]
        if window is None:
            assert held[-1] == 40
        else:
            assert max(held) == window.size - 1 and cache.layers[i].length == 40
            assert len({s[i][1] for s in sizes[10:]}) == 1  # no growth once warm
    with pytest.raises(PosencError, match="cannot be cropped"):
        cache.crop(30)
    assert cache.layers[0].length == 40  # the refusal changed no layer


@pytest.mark.parametrize("spec", ["gemma3:window=3", "irope-shipped:chunk=4", "rope:chunk=3+alibi"])
def test_a_padded_row_equals_the_row_alone(spec):
    """Rows of 9, 5 and 2 tokens left-padded in one batch: logits, a padded prefill then 3 decoding steps, and greedy
    generation equal each row alone (chunks count from each row's first token); a model of one pattern's layers."""
    torch.manual_seed(0)
    n_layer = max(4, len(encodings.layer_pattern(spec)))
    cfg = {"encoding": spec, "n_layer": n_layer, "n_head": 2, "d_model": 32, "vocab_size": 50}
    m = build_model(cfg).double().eval()
    gen = torch.Generator().manual_seed(1)
    rows = [torch.randint(0, 50, (n,), generator=gen) for n in (9, 5, 2)]
    ids, mask = pad_left(rows, pad_id=7)
    T, new = ids.shape[1], torch.randint(0, 50, (3, 3), generator=gen)
    with torch.no_grad():
        padded = m(ids, attention_mask=mask)
        cache = Cache(n_layer)
        steps = [m.decode(ids, cache, attention_mask=mask)] + [m.decode(new[:, i : i + 1], cache) for i in range(3)]
        decoded = torch.cat(steps, dim=1)
        generated = m.generate(ids, 4, temperature=0, attention_mask=mask)
        for b, row in enumerate(rows):
            n = len(row)
            alone = m(torch.cat((row, new[b]))[None])[0]
            assert (padded[b, T - n :] - alone[:n]).abs().max() < 1e-9
            assert (decoded[b, T - n :] - alone).abs().max() < 1e-9
            assert torch.equal(generated[b, T - n :], m.generate(row, 4, temperature=0))


@pytest.mark.parametrize(
    "spec,match",
    [
        ("rope:window=0", "window=0: must be an integer from 1 to 2^63 - 1"),
        ("rope:window=-2", "window=-2: must be an integer from 1 to 2^63 - 1"),
        ("rope:chunk=1.5", "chunk=1.5: must be an integer from 1 to 2^63 - 1"),
        ("rope:chunk=abc", "chunk='abc': must be an integer from 1 to 2^63 - 1"),
        ("nope:window=true", "window=True: must be an integer from 1 to 2^63 - 1"),
        (
            "gemma3:window=0",
            "scheme 'gemma3:window=0': window=0: must be an integer from 1 to 2^63 - 1",
        ),  # named as written
        ("irope-shipped:chunk=-1", "scheme 'irope-shipped:chunk=-1': chunk=-1: must be an integer from 1 to 2^63 - 1"),
        ("rope:window=4,chunk=8", "not both"),
        ("rope:window=4+alibi:window=2", "one part only"),
        ("learned-sinks:window=4", "window is not supported on 'learned-sinks', which replaces attention"),
        ("rope+logn:chunk=4", "chunk is not supported on 'logn', which replaces attention"),
        ("mla:window=4", "window is not supported on 'mla', which replaces attention (its own attend(), which takes"),
        ("sinusoidal:window=4", "additive input embedding"),
        ("gemma3:rope_theta=5", "it takes factor, window"),
        ("irope:window=4", "is a per-layer pattern"),
        ("irope-shipped:window=4", "it takes chunk"),
    ],
)
def test_bad_windows_are_one_line(spec, match):
    with pytest.raises(PosencError, match=re.escape(match)) as err:
        encodings.get(spec, Dims(2, 8, 16, 0, 16))
    assert "\n" not in str(err.value)


def test_the_command_line_refuses_a_bad_window_in_one_line(capsys):
    assert main(["train", "--scheme", "rope:window=0", "--preset", "quick"]) == 2
    assert capsys.readouterr().err.strip() == (
        "posenc: error: scheme 'rope:window=0': window=0: must be an integer from 1 to 2^63 - 1 (tokens)"
    )


def test_an_inference_method_refuses_a_windowed_layer():
    m = build_model({"encoding": "rope|rope:window=4", "n_layer": 2, "n_head": 2, "d_model": 16, "vocab_size": 50})
    with pytest.raises(PosencError, match="does not apply to a layer with a sliding window of 4 tokens"):
        set_method(m, "self-extend:group=2,window=4")
    assert all(block.attn.method is None for block in m.blocks)  # every layer checked before any changed


def test_the_drop_in_layer_cache_is_bounded_and_counts_every_position():
    layer = Attention(16, 2, "rope:window=3").eval()
    cache, x = LayerCache(), torch.randn(1, 20, 16)
    with torch.no_grad():
        for t in range(20):
            layer(x[:, t : t + 1], cache=cache)
    assert (cache.length, cache.evicted, cache._k.length, cache.pos.tolist()) == (20, 18, 2, [18, 19])


def test_a_pretrained_llama_with_a_window_is_transformers_mistral_sliding_window():
    """posenc's Hugging Face adaptation honours the window: a tiny Llama with ``rope:window=5`` gives the logits and
    the cached greedy generation of transformers' Mistral (the same weights, sliding_window 5)."""
    from posenc.hf import scheme as hf
    from tests.hf.tiny_llama import tiny_llama

    model = tiny_llama(0, 64, 5000.0)
    keys = transformers.MistralConfig().to_dict()
    cfg = transformers.MistralConfig(**{k: v for k, v in model.config.to_dict().items() if k in keys})
    cfg.sliding_window, cfg.head_dim = 5, 16
    mistral = transformers.MistralForCausalLM(cfg).eval()
    mistral.load_state_dict(model.state_dict())
    ids = torch.randint(0, 128, (1, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, full = mistral(ids).logits, model(ids).logits
        hf.apply_scheme(model, "rope:window=5")
        assert (model(ids).logits - want).abs().max() < 1e-5 < (full - want).abs().max()
        greedy = {"max_new_tokens": 5, "do_sample": False}
        assert torch.equal(model.generate(ids[:, :20], **greedy), mistral.generate(ids[:, :20], **greedy))


def test_gemma3_scales_the_global_layers_rope_only_as_transformers_gemma3():
    """Gemma 3 4B-27B (``rope_scaling`` linear, factor 8, with ``rope_local_base_freq`` 10K): transformers applies the
    scaling to the full-attention layers only; each layer equals ``gemma3:window=4,factor=8`` (the global entry's
    positions / 8, the local ones unscaled), and the unscaled pattern misses the global layer."""
    cfg = tiny_gemma3(rope_scaling={"rope_type": "linear", "factor": 8.0}, rope_local_base_freq=10000.0)
    assert cfg.rope_parameters["full_attention"] == {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}
    assert cfg.rope_parameters["sliding_attention"] == {"rope_type": "default", "rope_theta": 10000.0}
    torch.manual_seed(0)
    model = Gemma3TextModel(cfg).double().eval()
    seen = capture(model, 13)
    for i, layer in enumerate(model.layers):
        att, (x, want) = layer.self_attn, seen[i]
        norms = (att.q_norm, att.k_norm)
        assert (posenc_layer(att, x, "gemma3:window=4,factor=8", i, att.scaling, norms) - want).abs().max() < 1e-7, i
        unscaled = (posenc_layer(att, x, "gemma3:window=4", i, att.scaling, norms) - want).abs().max()
        assert unscaled > 1e-4 if i == 5 else unscaled < 1e-7, i
    assert encodings.layer_pattern("gemma3:factor=8")[4:] == ["rope:rope_theta=10000,window=1024"] + [
        "rope:rope_theta=1000000,factor=8"
    ]


@pytest.mark.parametrize(
    "spec,match",
    [
        ("rope:factor=0.5", r"rope: factor must be a number >= 1 \(positions / factor\), got 0.5$"),
        ("gemma3:factor=0", r"factor must be a number >= 1"),
        ("rnope-swa:factor=8", r"it takes window, for the entries that set it\)$"),
    ],
)
def test_bad_rope_factors_are_one_line(spec, match):
    with pytest.raises(PosencError, match=match) as err:
        encodings.get(spec, Dims(2, 8, 16, 0, 16, 5))
    assert "\n" not in str(err.value)
