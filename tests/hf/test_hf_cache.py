"""posenc.hf.scheme: a scheme's decoding state (every position's layer input x) lives in transformers' Cache.

Properties on a tiny Llama (2 layers, GQA) with every scheme apply_scheme accepts, learned parts moved away
from their neutral start so that x matters: beam search and sampling decode the same sequences with and
without the cache; the cache's own operations (reorder, crop, batch select and repeat, reset) act on x as on
the keys; a forward of another sequence between two decoding steps changes nothing.
"""

import pytest
import torch
from tiny_llama import tiny_llama

from posenc.errors import PosencError

transformers = pytest.importorskip("transformers")
from transformers import DynamicCache, StaticCache  # noqa: E402

from posenc import encodings  # noqa: E402
from posenc.hf import scheme as hf  # noqa: E402

REFUSED = {"learned", "sinusoidal", "acc-token-qk", "acc-token-qkv"}  # input embeddings; token ids
# the named patterns of more entries than the tiny Llama's 2 layers are refused on it (check_layer_count)
SCHEMES = [
    n
    for rows in encodings.catalogue().values()
    for n, _, _ in rows
    if n not in REFUSED and len(encodings.layer_pattern(n)) <= 2
] + ["rope+forget"]
# the fast tier decodes these (the three whose state is x, rope, a bias, random steps, one refusal);
# make test all
FAST = {"rope", "alibi", "acc-rand-qkv", "forget", "acc-learned-qkv", "hybrid", "path"}


def llama(seed):
    """The tiny Llama of tests/hf/test_scheme.py (tests/hf/tiny_llama.py)."""
    return tiny_llama(seed, 64, 5000.0)


def swapped(spec, seed=1):
    """llama(seed) with ``spec``, its learned posenc parts drawn N(0, 0.5^2) (no longer neutral: x matters)."""
    model = llama(seed)
    hf.apply_scheme(model, spec)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".posenc." in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model


def generate(model, ids, use_cache, **kw):
    torch.manual_seed(0)  # sampling draws the same numbers in both runs
    return model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, pad_token_id=0, use_cache=use_cache, **kw
    )


def test_the_catalogue_is_covered():
    assert len(SCHEMES) >= 24 and FAST <= set(SCHEMES)


@pytest.mark.parametrize("spec", [s if s in FAST else pytest.param(s, marks=pytest.mark.slow) for s in SCHEMES])
def test_beam_search_and_sampling_with_the_cache_equal_without_it(spec):
    """Beam search (3 beams, 2 returned: the cache is reordered and its rows repeated) and sampling (fixed seed);
    schemes that replace attention refuse cached decoding instead."""
    model, ids = swapped(spec), torch.randint(0, 128, (2, 5))
    if any(
        layer.self_attn.posenc.replaces_attention for layer in model.model.layers
    ):  # xPos, PaTH, CoPE, DAPE, PoPE: every query is needed
        with pytest.raises(PosencError, match=r"replaces attention .* use_cache=False\)\)$"):
            generate(model, ids, True, num_beams=2)
        return
    for kw in ({"num_beams": 3, "num_return_sequences": 2, "do_sample": False}, {"do_sample": True, "top_k": 0}):
        plain = generate(model, ids, False, **kw)
        assert plain.shape[1] == 9 and torch.equal(
            plain[:, :5], ids.repeat_interleave(kw.get("num_return_sequences", 1), 0)
        )
        assert torch.equal(generate(model, ids, True, **kw), plain), kw


@pytest.mark.parametrize(
    "spec", [s for s in SCHEMES if s not in ("xpos", "path", "cope", "dape", "dape-kerple", "pope")]
)
def test_an_unrelated_forward_between_prefill_and_decode_changes_nothing(spec):
    """A scheme that replaces attention needs every query: decoding through the cache is refused in one line."""
    model, ids, other = swapped(spec), torch.randint(0, 128, (1, 9)), torch.randint(0, 128, (1, 8))
    if model.model.layers[0].self_attn.posenc.replaces_attention:
        with torch.no_grad():
            cache = model(ids[:, :8], use_cache=True).past_key_values
            with pytest.raises(PosencError, match=r"replaces attention and needs every query: decode without"):
                model(ids[:, 8:], cache=cache, use_cache=True)
        return
    with torch.no_grad():
        full = model(ids).logits[:, -1]
        cache = model(ids[:, :8], use_cache=True).past_key_values
        model(other)  # the same length as the prefill: with state on the module, its x would be used silently
        model(other, use_cache=True)  # a cache of its own
        step = model(ids[:, 8:], cache=cache, use_cache=True).logits[:, -1]
    assert (step - full).abs().max().item() < 1e-4
    assert full.abs().max().item() > 0.1


def test_cache_operations_act_on_the_posenc_state():
    """reorder_cache, batch_select_indices, batch_repeat_interleave, crop and reset, each followed by decoding steps
    that must equal the full forward of the sequences the cache then stands for."""
    model = swapped("hybrid")
    ids = torch.randint(0, 128, (3, 12))

    def decode(cache, rows, start):
        with torch.no_grad():
            return torch.cat(
                [model(rows[:, t : t + 1], cache=cache, use_cache=True).logits for t in range(start, rows.shape[1])], 1
            )

    def full(rows, start):
        with torch.no_grad():
            return model(rows).logits[:, start:]

    def prefill(rows):
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(rows, cache=cache, use_cache=True)
        return cache

    def close(a, b):
        return (a - b).abs().max().item() < 1e-4

    cache = prefill(ids[:, :8])
    assert isinstance(cache.layers[0], hf.cache_layer_type()) and cache.layers[1].x.shape == (3, 8, 64)
    order = torch.tensor([2, 0, 0])
    cache.reorder_cache(order)  # beam search
    assert close(decode(cache, ids[order], 8), full(ids[order], 8))
    cache = prefill(ids[:, :8])
    cache.batch_select_indices(torch.tensor([1, 2]))
    assert close(decode(cache, ids[1:], 8), full(ids[1:], 8))
    cache = prefill(ids[:1, :8])
    cache.batch_repeat_interleave(2)
    assert close(decode(cache, ids[:1, :].repeat(2, 1), 8), full(ids[:1].repeat(2, 1), 8))
    cache = prefill(ids[:, :10])
    cache.crop(-4)  # back to 6 positions, then other tokens than the cropped ones
    other = torch.cat((ids[:, :6], ids.flip(0)[:, 6:]), 1)
    assert cache.layers[0].x.shape[1] == 6 and close(decode(cache, other, 6), full(other, 6))
    cache.reset()  # a new sequence in the same cache object
    with torch.no_grad():
        model(other[:, :5], cache=cache, use_cache=True)
    assert close(decode(cache, other, 5), full(other, 5))


def test_caches_without_posenc_state_are_refused():
    model, ids = llama(1), torch.randint(0, 128, (1, 6))
    with torch.no_grad():
        before = model(ids, use_cache=True).past_key_values  # keys rotated by the model's own RoPE
    hf.apply_scheme(model, "hybrid")
    static = StaticCache(config=model.config, max_cache_len=16)
    for cache, message in (
        (before, r"the KV cache holds 6 positions this posenc model did not decode"),
        (static, r"decodes with transformers' DynamicCache \(the default\); got StaticCache"),
    ):
        with pytest.raises(PosencError, match=message) as exc, torch.no_grad():
            model(ids[:, :1], cache=cache, use_cache=True)
        assert "\n" not in str(exc.value)
    with pytest.raises(PosencError, match="got StaticCache"):
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, cache_implementation="static")
