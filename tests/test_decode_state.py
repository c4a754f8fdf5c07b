"""Incremental decoding states (``Encoding.decoder``) equal the full recomputation, and never re-run the prefix's
hooks."""

import pytest
import torch
import torch.nn.functional as F
from test_decode import SPECS, T, model

from posenc.attention import Bias
from posenc.encodings.base import Buffer, Encoding, Inputs
from posenc.encodings.householder import path_keys
from posenc.errors import PosencError
from posenc.model import Cache
from posenc.rope import NAMES as SCHEDULES

REFERENCE_ONLY = {"dynamic", "longrope"}  # rope schedules whose frequencies follow the length


def decoded(m, x, reference, cuts=(7, 12)):
    """Logits of a prefill of x[:, :cuts[0]], a chunk up to cuts[1], then one token at a time; and the cache."""
    cache, out, start = Cache(len(m.blocks), reference=reference), [], 0
    for end in (*cuts, *range(cuts[-1] + 1, x.shape[1] + 1)):
        out.append(m.decode(x[:, start:end], cache))
        start = end
    return torch.cat(out, dim=1), cache


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize("spec", SPECS)
def test_incremental_decoding_equals_the_full_recomputation(spec, dtype, tol):
    torch.manual_seed(0)
    m, x = model(spec, dtype), torch.randint(0, 256, (2, T))
    with torch.no_grad():
        fast, cache = decoded(m, x, reference=False)
        slow, ref = decoded(m, x, reference=True)
    assert not any(layer.reference for layer in cache.layers) and all(layer.reference for layer in ref.layers)
    assert (fast - slow).abs().max().item() < tol


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_rope_schedules_decode_incrementally_except_those_following_the_length(schedule):
    torch.manual_seed(2)
    params = {"none": {}, "rerope": {"window": 6}, "leaky-rerope": {"window": 6, "leak": 4.0}}.get(
        schedule, {"factor": 4.0}
    )
    m, x = model("rope", schedule=schedule, schedule_params=params), torch.randint(0, 256, (1, T))
    with torch.no_grad():
        fast, cache = decoded(m, x, reference=False, cuts=(8,))
        slow, _ = decoded(m, x, reference=True, cuts=(8,))
    assert cache.layers[0].reference == (schedule in REFERENCE_ONLY)
    assert (fast - slow).abs().max().item() < 1e-10


def _record_hooks(m) -> list:
    """Wrap every scheme hook of m (phases, steps, bias and its tiles, attend, logits, gates) and every Linear inside
    a scheme: each call appends ("rows", n) for the positions it is given, each bias tile ("tile", qs, qe)."""
    seen = []

    def rows(inp):
        seen.append(("rows", inp.x.shape[1]))

    def wrap(enc, name):
        fn = getattr(enc, name)

        def hooked(*args, **kwargs):
            inp = next((a for a in args if hasattr(a, "pos") and hasattr(a, "x")), None)
            if name == "gates":
                seen.append(("rows", args[0].shape[1]))
            elif inp is not None:
                rows(inp)
            out = fn(*args, **kwargs)
            if name == "bias" and out is not None:
                bias = out

                def tiles(qs, qe, ks, ke):
                    seen.append(("tile", qs, qe))
                    return bias.tile(qs, qe, ks, ke)

                return Bias(tiles)  # the tiles only: every row the core asks for is counted
            return out

        setattr(enc, name, hooked)

    for enc in [e for e in m.modules() if isinstance(e, Encoding)]:
        for name in ("phases", "steps", "bias", "attend", "logits", "gates"):
            if hasattr(enc, name):
                wrap(enc, name)
        for lin in enc.modules():
            if isinstance(lin, torch.nn.Linear):
                lin.register_forward_pre_hook(lambda mod, args: seen.append(("rows", args[0].shape[-2])))
    return seen


@pytest.mark.parametrize("spec", SPECS)
def test_no_step_recomputes_the_prefix_hooks(spec):
    """After the prefill, each one-token step evaluates the scheme's hooks and layers on that token only and asks
    its bias for the last query row only; the reference, by contrast, sees the whole prefix."""
    torch.manual_seed(3)
    m, x = model(spec), torch.randint(0, 256, (1, T))
    seen = _record_hooks(m)
    for reference in (False, True):
        cache = Cache(len(m.blocks), reference=reference)
        with torch.no_grad():
            m.decode(x[:, :8], cache)
            seen.clear()
            for t in range(8, T):
                m.decode(x[:, t : t + 1], cache)
                assert all(s[1] == 1 if s[0] == "rows" else s[1] == t for s in seen) != reference, (seen, reference)
                if reference:
                    break
                seen.clear()


def test_path_keys_equal_the_decoding_recurrence():
    torch.manual_seed(4)
    B, H, n, D = 2, 3, 37, 8
    k, beta = torch.randn(B, H, n, D, dtype=torch.float64), 2 * torch.rand(B, H, n, dtype=torch.float64)
    w = F.normalize(torch.randn(B, H, n, D, dtype=torch.float64), dim=-1)
    cache = k[:, :, :0]
    for t in range(n):  # householder_naive.path_decode's key update
        cache = cache - beta[:, :, t, None, None] * (cache @ w[:, :, t, :, None]) * w[:, :, t, None, :]
        cache = torch.cat((cache, k[:, :, t : t + 1]), dim=2)
    for block in (1, 5, 64):
        assert (path_keys(k, w, beta, block) - cache).abs().max().item() < 1e-12


@pytest.mark.parametrize(
    "spec", ["rope", "hybrid", "acc-rand-qkv:a=0.3+alibi", "rope+forget", "xpos", "cope", "dape", "pope", "t5"]
)
def test_crop_and_reorder_continue_as_a_fresh_cache(spec):
    torch.manual_seed(5)
    m, x, y = model(spec), torch.randint(0, 256, (2, 14)), torch.randint(0, 256, (2, 4))
    with torch.no_grad():
        cache = Cache(len(m.blocks))
        m.decode(x, cache)
        cache.crop(10)  # e.g. rejected speculative tokens
        got = torch.cat([m.decode(y[:, i : i + 1], cache) for i in range(4)], dim=1)
        assert (got - m(torch.cat((x[:, :10], y), dim=1))[:, 10:]).abs().max().item() < 1e-10
        beams = torch.tensor([1, 0, 1])
        cache.reorder(beams)
        z = torch.randint(0, 256, (3, 1))
        full = torch.cat((x[:, :10], y), dim=1)[beams]
        assert (m.decode(z, cache) - m(torch.cat((full, z), dim=1))[:, -1:]).abs().max().item() < 1e-10
    assert cache.length == 15 and cache.nbytes() > 0


@pytest.mark.parametrize("spec", ["rope", "acc-rand-qkv:a=0.3+alibi", "rope+forget", "path", "learned", "fire"])
@pytest.mark.parametrize("reference", [False, True])
@pytest.mark.parametrize("prompts, beams", [(1, [0, 0, 0]), (2, [0, 0, 0]), (2, [1, 0, 1])])
def test_a_reorder_to_more_rows_decodes_each_row_as_alone(spec, reference, prompts, beams):
    """Beam search's first step: a prefill's rows copied to more beams (issue 59: from a batch of 1 the cache kept
    one row, and the next step was refused); each beam then decodes as its prompt alone would, across the buffers'
    growth (a batch of 1 broadcast over the rows, the random steps', grows to the beams too)."""
    torch.manual_seed(8)
    m, x, z = model(spec), torch.randint(0, 256, (prompts, 6)), torch.randint(0, 256, (len(beams), 5))
    with torch.no_grad():
        cache = Cache(len(m.blocks), reference=reference)
        m.decode(x, cache)
        cache.reorder(torch.tensor(beams))
        got = torch.cat([m.decode(z[:, i : i + 1], cache) for i in range(5)], dim=1)
        for b, row in enumerate(beams):
            alone = Cache(len(m.blocks), reference=reference)
            m.decode(x[row : row + 1], alone)
            want = torch.cat([m.decode(z[b : b + 1, i : i + 1], alone) for i in range(5)], dim=1)
            assert (got[b] - want[0]).abs().max().item() < 1e-10, b
    assert cache.tokens.shape == (len(beams), 11)


def test_path_refuses_to_crop_but_keeps_its_cache():
    m, cache = model("path"), Cache(2)
    with torch.no_grad():
        m.decode(torch.zeros(1, 6, dtype=torch.long), cache)
    cache.crop(6)  # the same length is no change
    with pytest.raises(PosencError, match="path cannot crop"):
        cache.crop(3)
    assert all(layer.length == 6 for layer in cache.layers)


def test_a_crop_that_one_layer_refuses_changes_no_layer():
    """A crop refused by the second layer's scheme (PaTH) leaves the first (RoPE) as it was: every part is asked
    (``check_crop``) before any crops (the first layer was cropped to 3 positions, the second kept 6)."""
    m, cache = model("rope|path"), Cache(2)
    with torch.no_grad():
        m.decode(torch.zeros(1, 6, dtype=torch.long), cache)
    held = cache.nbytes()
    with pytest.raises(PosencError, match="path cannot crop"):
        cache.crop(3)
    assert [layer.length for layer in cache.layers] == [6, 6] and cache.length == 6 and cache.nbytes() == held


def test_buffers_grow_by_doubling_without_copying_the_prefix_per_step():
    buf, storages = Buffer(-2), set()
    for t in range(200):
        buf.append(torch.full((1, 2, 1, 3), float(t)))
        storages.add(buf.data.data_ptr())
    assert len(storages) <= 9 and buf.data.shape[-2] == 256  # 1, 2, 4, ..., 256 rows
    assert torch.equal(buf.value[0, 0, :, 0], torch.arange(200.0))
    reserved = Buffer(-2, capacity=300)
    reserved.append(torch.zeros(1, 2, 5, 3))
    assert reserved.data.shape[-2] == 300 and reserved.nbytes() == 300 * 6 * 4


def test_generate_uses_the_incremental_cache_and_equals_the_reference():
    torch.manual_seed(6)
    m, prompt = model("hybrid"), torch.randint(0, 256, (1, 5))
    out = m.generate(prompt, 6, temperature=0)
    with torch.no_grad():
        cache, ids = Cache(2, reference=True), prompt
        logits = m.decode(prompt, cache)[:, -1]
        for _ in range(6):
            ids = torch.cat((ids, logits.argmax(-1, keepdim=True)), dim=1)
            logits = m.decode(ids[:, -1:], cache)[:, -1]
    assert torch.equal(out, ids)


def test_running_phase_keeps_float32_steps_and_a_crop_resets_it_to_the_parallel_phase():
    """The accumulated rotations' state holds one running float64 phase and each position's float32 steps
    (not a float64 phase per position); a crop to L gives back the parallel forward's Phi_{L-1}."""
    torch.manual_seed(6)
    m, x = model("acc-rand-qkv", torch.float32), torch.randint(0, 256, (2, 14))
    with torch.no_grad():
        cache = Cache(len(m.blocks))
        m.decode(x[:, :9], cache)
        for t in range(9, 14):
            m.decode(x[:, t : t + 1], cache)
        state, enc = cache.layers[1].state, m.blocks[1].attn.enc
        assert state.theta.value.dtype == torch.float32 and state.last.shape == (1, 2, 1, 8)  # one draw for every row
        assert state.nbytes() == state.theta.nbytes() + 2 * 8 * 8
        phi = torch.cumsum(enc.steps(Inputs(torch.zeros(1, 14, 32), torch.arange(14))).double(), dim=-2)
        assert (state.last - phi[..., 13:, :]).abs().max().item() < 1e-12
        cache.crop(6)
        assert (state.last - phi[..., 5:6, :]).abs().max().item() < 1e-12
        m.decode(x[:, 6:7], cache)
        assert (state.last - phi[..., 6:7, :]).abs().max().item() < 1e-12


@pytest.mark.parametrize("spec", ["path", "path+forget"])
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_path_decoding_across_flushes_of_its_pending_factors_equals_the_parallel_forward(spec, dtype, tol, monkeypatch):
    """With a flush every 3 tokens, one-token steps and chunks cross several flushes; beams reordered between
    flushes keep their pending factors."""
    from posenc.encodings.householder import PaTHState

    monkeypatch.setattr(PaTHState, "flush_every", 3)
    torch.manual_seed(7)
    m, x = model(spec, dtype), torch.randint(0, 256, (2, T))
    with torch.no_grad():
        got, cache = decoded(m, x, reference=False, cuts=(6, 10))  # 14 tokens after the prefill: 4 flushes
        assert (got - m(x)).abs().max().item() < tol
        pending = next(
            s for s in getattr(cache.layers[0].state, "states", [cache.layers[0].state]) if isinstance(s, PaTHState)
        ).pending
        assert pending.count == 2 and pending.flushed == T - 2
        beams = torch.tensor([1, 1, 0])
        cache.reorder(beams)
        z = torch.randint(0, 256, (3, 1))
        assert (m.decode(z, cache) - m(torch.cat((x[beams], z), dim=1))[:, -1:]).abs().max().item() < tol
