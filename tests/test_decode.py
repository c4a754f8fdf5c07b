"""Incremental decoding (LM.decode with a Cache) equals the parallel forward, for every scheme."""

import pytest
import torch

from posenc import encodings
from posenc.config.plan import load_preset
from posenc.errors import PosencError
from posenc.model import Cache, build_model
from posenc.rope import SCHEDULES as SCHEDULE_NAMES
from posenc.store.presets import preset_names

PRESET_SPECS = sorted({s for name in preset_names() for s in load_preset(name).schemes})
SPECS = sorted(
    set(encodings.names())
    | set(PRESET_SPECS)
    | {"acc-rand-qkv:a=0.3+alibi", "path+forget", "rope:rotary_fraction=0.5", "rope|nope"}
)
T = 20


def model(spec, dtype=torch.float64, **params):
    """A model of ``spec``: 2 layers, or a pattern's entries (gemma3: 6)."""
    n_layer = max(2, len(encodings.layer_pattern(spec)))
    cfg = {
        "encoding": spec,
        "n_layer": n_layer,
        "n_head": 2,
        "d_model": 32,
        "train_length": T,
        "encoding_params": params,
    }
    return build_model(cfg).to(dtype).eval()


def decoded(m, x, cuts=(7, 12)):
    """Logits of a prefill of x[:, :cuts[0]], a chunk up to cuts[1], then one token at a time."""
    cache, out, start = Cache(len(m.blocks)), [], 0
    for end in (*cuts, *range(cuts[-1] + 1, x.shape[1] + 1)):
        out.append(m.decode(x[:, start:end], cache))
        start = end
    assert cache.length == x.shape[1]
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("spec", SPECS)
def test_decode_equals_parallel_float64(spec):
    torch.manual_seed(0)
    m, x = model(spec), torch.randint(0, 256, (2, T))
    with torch.no_grad():
        err = (decoded(m, x) - m(x)).abs().max().item()
    assert err < 1e-10, err


@pytest.mark.parametrize("spec", ["rope", "alibi", "hybrid", "rope+forget", "acc-rand-qkv", "path", "xpos", "cope"])
def test_decode_equals_parallel_float32(spec):
    torch.manual_seed(1)
    m, x = model(spec, torch.float32), torch.randint(0, 256, (2, T))
    with torch.no_grad():
        err = (decoded(m, x) - m(x)).abs().max().item()
    assert err < 1e-5, err


L0 = 8  # the schedules' original context: every cut pattern below crosses it
HALF = 8  # head dim 16 / 2 frequency pairs
SCHEDULE_PARAMS = {
    "none": {},
    "rerope": {"window": 2},
    "leaky-rerope": {"window": 2, "leak": 4.0},
    "longrope": {
        "factor": 4.0,
        "short_factor": [1 + 0.1 * i for i in range(HALF)],
        "long_factor": [1 + i for i in range(HALF)],
    },
}


def scheduled(schedule, n_layer, dtype=torch.float64):
    """A RoPE model of L0 = 8 under ``schedule`` whose weights are large enough (std 0.5) that a stale cached
    layer input moves the logits by far more than rounding."""
    cfg = {
        "encoding": "rope",
        "n_layer": n_layer,
        "n_head": 2,
        "d_model": 32,
        "train_length": L0,
        "encoding_params": {"schedule": schedule, "schedule_params": SCHEDULE_PARAMS.get(schedule, {"factor": 4.0})},
    }
    m = build_model(cfg).to(dtype).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.5)
    return m


@pytest.mark.parametrize("cuts", [(L0,), (5, 11), (3,)], ids=["prefill-at-L0", "chunk-across-L0", "short-prefill"])
@pytest.mark.parametrize("n_layer", [1, 2, 3, 4])
@pytest.mark.parametrize("schedule", list(SCHEDULE_NAMES))
def test_decode_equals_the_prefix_forward_for_every_schedule_and_depth(schedule, n_layer, cuts):
    """Each decoded chunk [s, e) equals the parallel forward of the prefix [0, e) at those positions, past
    the schedule's L0 too (dynamic NTK's base and LongRoPE's factor list follow the length so far)."""
    torch.manual_seed(2)
    m, x = scheduled(schedule, n_layer), torch.randint(0, 256, (2, T))
    cache, start = Cache(n_layer), 0
    with torch.no_grad():
        for end in (*cuts, *range(cuts[-1] + 1, T + 1)):
            err = (m.decode(x[:, start:end], cache) - m(x[:, :end])[:, start:end]).abs().max().item()
            assert err < 1e-10, (start, end, err)
            start = end


def test_a_cache_cropped_back_below_L0_decodes_as_the_prefix_forward():
    """The cache remembers the frequencies its layer inputs were computed under, not only its length."""
    torch.manual_seed(4)
    m, x = scheduled("longrope", 2), torch.randint(0, 256, (1, T))
    cache = Cache(2)
    with torch.no_grad():
        m.decode(x[:, :12], cache)  # past L0: the long factors
        cache.crop(5)
        got = torch.cat([m.decode(x[:, t : t + 1], cache) for t in range(5, 12)], dim=1)
        ref = torch.cat([m(x[:, : t + 1])[:, -1:] for t in range(5, 12)], dim=1)
    assert (got - ref).abs().max().item() < 1e-10


@pytest.mark.parametrize("schedule", ["dynamic", "longrope"])
def test_generate_equals_uncached_greedy_decoding_across_L0(schedule):
    torch.manual_seed(3)
    m, ids = scheduled(schedule, 3), torch.randint(0, 256, (2, 5))
    out = m.generate(ids, T - 5, temperature=0)
    with torch.no_grad():
        for _ in range(T - 5):
            ids = torch.cat((ids, m(ids)[:, -1:].argmax(-1)), dim=1)
    assert torch.equal(out, ids)


def test_chunked_prefill_leaves_the_state_of_one_prefill():
    torch.manual_seed(3)
    m, x = model("hybrid"), torch.randint(0, 256, (2, 15))
    one, chunks = Cache(2), Cache(2)
    with torch.no_grad():
        m.decode(x, one)
        for a, b in ((0, 4), (4, 5), (5, 15)):
            m.decode(x[:, a:b], chunks)
    for l1, l2 in zip(
        one.layers, chunks.layers
    ):  # rotated keys and values, running phase and steps, cumulative log-gates
        (rot1, gate1), (rot2, gate2) = l1.state.states, l2.state.states
        for a, b in (
            (l1.k, l2.k),
            (l1.v, l2.v),
            (rot1.last, rot2.last),
            (rot1.theta.value, rot2.theta.value),
            (gate1.lam.value, gate2.lam.value),
        ):
            assert torch.allclose(a, b, atol=1e-12, rtol=0)


def test_generate_greedy_continues_with_the_parallel_argmax():
    torch.manual_seed(4)
    m, prompt = model("acc-rand-qkv"), torch.randint(0, 256, (5,))
    out = m.generate(prompt, 6, temperature=0)
    assert out.shape == (11,) and torch.equal(out[:5], prompt)
    with torch.no_grad():
        for t in range(5, 11):  # each new token is the parallel forward's argmax on what precedes it
            assert int(out[t]) == int(m(out[None, :t])[0, -1].argmax())


def test_generate_samples_reproducibly_and_respects_top_k():
    torch.manual_seed(5)
    m, prompt = model("rope", torch.float32), torch.randint(0, 256, (2, 4))
    a, b = (
        m.generate(prompt, 8, temperature=1.0, top_k=3, seed=7),
        m.generate(prompt, 8, temperature=1.0, top_k=3, seed=7),
    )
    assert a.shape == (2, 12) and torch.equal(a, b)
    assert not torch.equal(a, m.generate(prompt, 8, temperature=1.0, top_k=3, seed=8))
    out = m.generate(prompt, 1, top_k=1, seed=0)  # top-1 sampling is greedy
    assert torch.equal(out, m.generate(prompt, 1, temperature=0))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_new_tokens": -1}, "max_new_tokens"),
        ({"max_new_tokens": 2, "temperature": float("nan")}, "temperature"),
        ({"max_new_tokens": 2, "top_k": 0}, "top_k"),
    ],
)
def test_generate_rejects_bad_arguments(kwargs, match):
    with pytest.raises(PosencError, match=match):
        model("rope").generate(torch.tensor([1, 2]), **kwargs)


def test_generate_rejects_an_empty_prompt_and_a_length_beyond_a_learned_table():
    with pytest.raises(PosencError, match="T >= 1"):
        model("rope").generate(torch.zeros(0, dtype=torch.long), 3)
    with pytest.raises(PosencError, match=f"exceed the learned position table of {T}"):
        model("learned").generate(torch.zeros(T - 2, dtype=torch.long), 3)
    with pytest.raises(PosencError, match="prompt token ids must be an int64 tensor, got torch.float32"):
        model("rope").generate(torch.ones(3), 2)
    with pytest.raises(PosencError, match=r"must lie in \[0, 256\), got \[-1, 300\]"):
        model("rope").generate(torch.tensor([-1, 300]), 2)
    m, cache = model("rope"), Cache(2)
    m.decode(torch.zeros(2, 3, dtype=torch.long), cache)
    with pytest.raises(PosencError, match="batch size 2"):
        m.decode(torch.zeros(1, 1, dtype=torch.long), cache)
