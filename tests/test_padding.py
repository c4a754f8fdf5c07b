"""Left-padded batches (``attention_mask``) through ``LM.forward``, ``decode`` and ``generate``, the drop-in layer and
the functional form: a padded row's logits at its tokens, its decoding steps and its greedy generation equal the row
alone's, for every scheme of the registry; what cannot honour a mask refuses in one line."""

import pytest
import torch

import posenc
from posenc import encodings
from posenc.attention import attention, flex_causal, naive_attention
from posenc.errors import PosencError
from posenc.layer import LayerCache, attend, padding_bias, padding_starts, prepare
from posenc.model import Cache, build_model, pad_left, set_method
from posenc.rope import SCHEDULES

SPECS = sorted(
    set(encodings.names())
    | {
        "acc-rand-qkv:a=0.3+alibi",
        "path+forget",
        "rope|nope",
        "rope+learned-sinks",
        "rope+logn:base_length=4",
        "p-rope+ssmax",
    }
)
LENGTHS = (9, 5, 2)  # prompts of different lengths; the longest row has no padding
PAD = 7  # a pad id the rows also use: only the mask tells padding from tokens


def model(spec, dtype=torch.float64, **cfg):
    """A model of ``spec`` (2 layers, or a pattern's entries) with weights moved off their init (std 0.1 noise on
    every parameter), so that learned steps (W = 0 at init), gates and tables all act and a leak of the padding shows
    far above rounding."""
    n_layer = max(2, len(encodings.layer_pattern(spec)))  # every entry of a pattern (gemma3: 6)
    m = build_model(
        {"encoding": spec, "n_layer": n_layer, "n_head": 2, "d_model": 32, "train_length": 16, "vocab_size": 50, **cfg}
    )
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen).to(p.dtype))
    return m.to(dtype).eval()


def prompts(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 50, (n,), generator=gen) for n in LENGTHS]


@pytest.mark.parametrize("spec", SPECS)
def test_a_padded_row_equals_the_row_alone(spec):
    """Logits at the real tokens (parallel forward), a padded prefill then decoding steps, and greedy generate."""
    torch.manual_seed(0)
    m, rows = model(spec), prompts()
    ids, mask = pad_left(rows, pad_id=PAD)
    T, new = ids.shape[1], torch.randint(0, 50, (len(rows), 3))
    with torch.no_grad():
        padded = m(ids, attention_mask=mask)
        cache = Cache(len(m.blocks))
        steps = [m.decode(ids, cache, attention_mask=mask)]
        steps += [m.decode(new[:, i : i + 1], cache) for i in range(new.shape[1])]
        decoded = torch.cat(steps, dim=1)
        generated = m.generate(ids, 4, temperature=0, attention_mask=mask)
        for b, row in enumerate(rows):
            n = len(row)
            alone = m(torch.cat((row, new[b]))[None])[0]
            assert (padded[b, T - n :] - alone[:n]).abs().max() < 1e-9, "forward"
            assert (decoded[b, T - n :] - alone).abs().max() < 1e-9, "decode"
            assert torch.equal(generated[b, T - n :], m.generate(row, 4, temperature=0)), "generate"
            assert torch.equal(generated[b, : T - n], ids[b, : T - n])  # the padding kept at the left


SCHEDULE_PARAMS = {  # head dim 16: 8 frequency pairs; ReRoPE's window below the shortest row (alone: refused)
    "none": {},
    "rerope": {"window": 1},
    "leaky-rerope": {"window": 1, "leak": 4.0},
    "longrope": {
        "factor": 4.0,
        "short_factor": [1 + 0.1 * i for i in range(8)],
        "long_factor": [1 + i for i in range(8)],
    },
}


def assert_rows_equal_alone(m, rows, tol):
    """Each of ``rows`` left-padded in one batch: its logits within ``tol`` of the row alone, its 4 greedy tokens
    equal."""
    ids, mask = pad_left(rows, pad_id=PAD)
    T = ids.shape[1]
    with torch.no_grad():
        padded, generated = m(ids, attention_mask=mask), m.generate(ids, 4, temperature=0, attention_mask=mask)
        for b, row in enumerate(rows):
            n = len(row)
            assert (padded[b, T - n :] - m(row[None])[0]).abs().max() < tol
            assert torch.equal(generated[b, T - n :], m.generate(row, 4, temperature=0))


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_every_rope_schedule_honours_the_mask(schedule):
    """Within L0 = 16 (9 prompt and 4 generated tokens), dynamic NTK and LongRoPE give every row the frequencies it
    would take alone, so every schedule runs a padded batch (ReRoPE's attention takes the mask in its bias)."""
    params = {"schedule": schedule, "schedule_params": SCHEDULE_PARAMS.get(schedule, {"factor": 4.0})}
    m, rows = model("rope", encoding_params=params), prompts(2)
    assert_rows_equal_alone(m, rows, 1e-9)


def test_a_padded_row_equals_the_row_alone_in_float32_with_a_canon_layer():
    """float32 tolerance; the Canon layer's convolution reads zeros before a row's first token, as alone."""
    m, rows = model("acc-rand-qkv", torch.float32, canon=3), prompts(1)
    assert_rows_equal_alone(m, rows, 1e-5)


def test_without_padding_the_numbers_are_unchanged():
    """A mask of ones is the unpadded computation, bit for bit (the committed perplexities rest on it)."""
    m, x = model("hybrid", torch.float32), torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        assert torch.equal(m(x, attention_mask=torch.ones_like(x)), m(x))
    assert padding_starts(torch.ones(2, 12), 2, 12) is None


@pytest.mark.parametrize("spec", ["rope", "alibi", "path", "acc-rand-qkv+forget"])
def test_the_drop_in_layer_and_the_functional_form_take_a_mask(spec):
    """``posenc.Attention`` forward and LayerCache decoding, and ``prepare`` / ``attend``, with left padding."""
    torch.manual_seed(0)
    layer = posenc.Attention(32, 2, spec, train_length=16).double().eval()
    x, first = torch.randn(2, 8, 32, dtype=torch.float64), 3
    mask = torch.ones(2, 8, dtype=torch.int64)
    mask[1, :first] = 0
    with torch.no_grad():
        padded = layer(x, attention_mask=mask)
        cache = LayerCache()
        decoded = torch.cat((layer(x[:, :6], cache=cache, attention_mask=mask[:, :6]), layer(x[:, 6:], cache=cache)), 1)
        alone = layer(x[1:, first:])
        assert (padded[1, first:] - alone[0]).abs().max() < 1e-10
        assert (decoded[1, first:] - alone[0]).abs().max() < 1e-10
        assert (padded[0] - layer(x[:1])[0]).abs().max() < 1e-10  # the unpadded row
        if spec == "rope":  # the functional form (no learned parameters in the scheme)
            q, k, v = layer.project(x)
            p = prepare("rope", x, n_head=2, train_length=16, attention_mask=mask)
            out = attend(q, k, v, p)[1, :, first:]
            q1, k1, v1 = (t[1:, :, first:] for t in (q, k, v))
            p1 = prepare("rope", x[1:, first:], n_head=2, train_length=16)
            assert (out - attend(q1, k1, v1, p1)[0]).abs().max() < 1e-10


def test_the_fast_attention_paths_agree_with_the_naive_reference_under_the_mask():
    """The chunked SDPA path (several blocks, with and without a scheme bias, decoding rows) against the full T x T
    softmax; the pointwise ``at`` form (FlexAttention's, on CUDA) against the tiles."""
    torch.manual_seed(0)
    B, H, T, D = 3, 2, 11, 8
    q, k, v = (torch.randn(B, H, T, D, dtype=torch.float64) for _ in range(3))
    first = torch.tensor([0, 4, 9])
    pad = padding_bias(first)
    ref = naive_attention(q, k, v, bias=pad)
    assert torch.isfinite(ref).all()  # a padding query still sees itself
    assert (attention(q, k, v, bias=pad, block_size=4) - ref).abs().max() < 1e-12
    assert (attention(q[..., 6:, :], k, v, bias=pad, block_size=4) - ref[..., 6:, :]).abs().max() < 1e-12
    for b in range(B):  # a real query's output is the row alone's
        alone = naive_attention(q[b : b + 1, :, first[b] :], k[b : b + 1, :, first[b] :], v[b : b + 1, :, first[b] :])
        assert (ref[b, :, first[b] :] - alone[0]).abs().max() < 1e-12
    tile = pad.tile(0, T, 0, T)
    b, qi, ki = torch.meshgrid(torch.arange(B), torch.arange(T), torch.arange(T), indexing="ij")
    assert torch.equal(pad.at(b, 0, qi, ki), tile[:, 0])


@pytest.mark.slow
def test_flex_attention_agrees_with_the_naive_reference_under_the_mask():
    """The CUDA evaluation path of pointwise biases (compiled FlexAttention, here on CPU) with the padding's ``at``,
    alone and summed with a scheme's (ALiBi's), against the full softmax."""
    from posenc.encodings.bias import alibi_slopes, distance_bias
    from posenc.encodings.composite import sum_biases

    torch.manual_seed(0)
    B, H, T, D = 3, 2, 128, 16
    q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
    pad = padding_bias(torch.tensor([0, 40, 127]))
    both = sum_biases([distance_bias(alibi_slopes(H), torch.arange(T)), pad])
    with torch.no_grad():
        for bias in (pad, both):
            got = flex_causal(q, k, v, bias.at, D**-0.5)
            torch.testing.assert_close(got, naive_attention(q, k, v, bias=bias), atol=2e-5, rtol=1e-4)


def refuses(fn, match):
    with pytest.raises(PosencError, match=match) as info:
        fn()
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "mask, match",
    [
        ([[1, 1, 0]], "padding after a token"),
        ([[0, 1, 0]], "padding after a token"),
        ([[0, 0, 0]], "no tokens"),
        ([[2, 1, 1]], "only 0"),
        ([[1, 1]], r"\(1, 3\)"),
    ],
    ids=["right", "inner", "empty-row", "not-binary", "shape"],
)
def test_bad_masks_are_one_line(mask, match):
    m = model("rope")
    refuses(lambda: m(torch.zeros(1, 3, dtype=torch.int64), attention_mask=torch.tensor(mask)), match)
    refuses(lambda: m.generate(torch.zeros(1, 3, dtype=torch.int64), 2, attention_mask=torch.tensor(mask)), match)


def test_what_cannot_honour_a_mask_refuses_in_one_line():
    ids, mask = pad_left(prompts(), pad_id=PAD)
    m = model("rope")
    refuses(lambda: m(ids, torch.arange(ids.shape[1]), attention_mask=mask), "not both")
    cache = Cache(len(m.blocks))
    m.decode(ids, cache, attention_mask=mask)
    refuses(lambda: m.decode(ids[:, :1], cache, attention_mask=mask[:, :1]), "first step only")
    set_method(m, "self-extend:group=2,window=4")
    refuses(lambda: m(ids, attention_mask=mask), "self-extend.*padding mask")
    refuses(lambda: m.generate(ids, 2, attention_mask=mask), "self-extend.*padding mask")
    # dynamic NTK past L0 = 16: the rows' own lengths (2 to 9 tokens, plus the generated) would set other frequencies
    m = model("rope", encoding_params={"schedule": "dynamic", "schedule_params": {"factor": 2.0}})
    long_ids, long_mask = pad_left([torch.arange(20) % 50, torch.arange(3)])
    refuses(lambda: m(long_ids, attention_mask=long_mask), "frequencies with the sequence length")
    refuses(lambda: m.generate(ids, 10, attention_mask=mask), "frequencies")  # past L0 at the 8th step: refused first
    with torch.no_grad():  # below L0 every row takes the same frequencies: honoured
        out = m(ids, attention_mask=mask)
        assert (out[2, -2:] - m(prompts()[2][None])[0]).abs().max() < 1e-9
    refuses(lambda: pad_left([]), "at least one prompt")
