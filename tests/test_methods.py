"""Self-Extend, LM-Infinite and attention sinks (posenc.methods): position maps against hand-computed tables
from the papers' definitions, the blockwise path against the full T x T reference (values and gradients),
decoding against the parallel forward, and the sinks' bounded cache."""

import re

import pytest
import torch

from posenc.errors import PosencError
from posenc.methods import (
    Method,
    block_keys,
    method_attention,
    naive_method_attention,
    parse,
    relative_positions,
    scheme_args,
)
from posenc.model import LM, Cache, ModelConfig, set_method, with_rope_schedule
from posenc.rope import rope_inv_freq

X = None  # hidden pair in a table


def table(method, T):
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    d, visible = relative_positions(method, i, j)
    return [[int(d[a, b]) if visible[a, b] else X for b in range(a + 1)] for a in range(T)]


def test_self_extend_table():
    # W = 4, G = 2: i - j below 4, else i//2 - j//2 + (4 - 4//2) (Jin et al. 2024, eq. 3-4)
    assert table(Method("self-extend", window=4, group=2), 8) == [
        [0],
        [1, 0],
        [2, 1, 0],
        [3, 2, 1, 0],
        [4, 3, 2, 1, 0],
        [4, 4, 3, 2, 1, 0],
        [5, 5, 4, 3, 2, 1, 0],
        [5, 5, 4, 4, 3, 2, 1, 0],
    ]


def test_lm_infinite_table():
    # one global token, window 3, distance capped at 3 (Han et al. 2023)
    assert table(Method("lm-infinite", window=3, n_global=1), 6) == [
        [0],
        [1, 0],
        [2, 1, 0],
        [3, 2, 1, 0],
        [3, X, 2, 1, 0],
        [3, X, X, 2, 1, 0],
    ]


def test_sinks_table():
    # two sinks, window 2: the cache at i holds {0, 1, i-1, i}, positions are cache slots (Xiao et al. 2024)
    assert table(Method("sinks", window=2, n_sink=2), 6) == [
        [0],
        [1, 0],
        [2, 1, 0],
        [3, 2, 1, 0],
        [3, 2, X, 1, 0],
        [3, 2, X, X, 1, 0],
    ]


def test_dual_chunk_table():
    # chunks of S = 3, local window w = 1 (An et al. 2024, sec. 3, ChunkLlama's positions): keys at j mod 3; queries
    # at i mod 3 in their chunk, min(i mod 3 + 3, 4) for the previous chunk, min(2*3 - 1, 4) = 4 for earlier ones
    assert table(parse("dual-chunk:chunk=3,local=1", 8), 9) == [
        [0],
        [1, 0],
        [2, 1, 0],
        [3, 2, 1, 0],
        [4, 3, 2, 1, 0],
        [4, 3, 2, 2, 1, 0],
        [4, 3, 2, 3, 2, 1, 0],
        [4, 3, 2, 4, 3, 2, 1, 0],
        [4, 3, 2, 4, 3, 2, 2, 1, 0],
    ]


@pytest.mark.parametrize("S, w, T", [(3, 1, 9), (88, 8, 1000), (5, 7, 60), (4, 0, 30)])
def test_dual_chunk_distances_stay_within_the_chunk_plus_the_local_window(S, w, T):
    """Every relative position lies in [0, S + w] however long the input (the point of the method), the distance
    to the chunk's own keys is i - j, and the successive chunk's first w queries keep their distance i - j."""
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    d, visible = relative_positions(Method("dual-chunk", window=S, chunk=S, local=w), i, j)
    assert bool(visible.equal(j <= i)) and int(d.max()) <= S + w and int(d[visible].min()) >= 0
    same, succ = (i // S == j // S) & visible, (i // S - j // S == 1) & (i % S < w)
    assert torch.equal(d[same], (i - j).expand(T, T)[same]) and torch.equal(d[succ], (i - j).expand(T, T)[succ])


METHODS = [
    Method("self-extend", window=5, group=3),
    Method("lm-infinite", window=6, n_global=2),
    Method("sinks", window=5, n_sink=3),
    Method("dual-chunk", window=4, chunk=4, local=2),
]


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
def test_near_far_split_equals_the_definition(method):
    i, j = torch.arange(40)[:, None], torch.arange(40)[None, :]
    d, visible = relative_positions(method, i, j)
    assert torch.equal(method.visible(i, j), visible)
    assert torch.equal(method.distance(i, j)[visible], d[visible])


def _qkv(T=23, D=8, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 2, T, D, generator=g, dtype=dtype, requires_grad=True) for _ in range(3)]


def _model(encoding, train_length=8, **kw):
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=32,
        n_layer=2,
        n_head=2,
        d_model=16,
        train_length=train_length,
        encoding=encoding,
        attn_block_size=5,
        **kw,
    )
    return LM(cfg).double().eval()


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
@pytest.mark.parametrize("scheme", ["rope", "rope-adjacent-partial", "alibi", "t5", "kerple"])
def test_blockwise_equals_naive(method, scheme):
    """Values and gradients (to q, k, v and the bias parameters) of the blockwise path against the T x T reference."""
    T = 23
    q, k, v = _qkv(T)
    pos = torch.arange(T)
    if scheme.startswith("rope"):
        partial = scheme.endswith("partial")
        kw = {"inv_freq": rope_inv_freq(4 if partial else 8, 10000.0), "pairing": "adjacent" if partial else "half"}
        params = []
    else:
        enc = _model(scheme).blocks[0].attn.enc
        with torch.no_grad():
            for p in enc.parameters():
                p.normal_()
        kw, params = scheme_args(enc, method, torch.zeros(1, 1, 16, dtype=torch.float64)), list(enc.parameters())
    fast = method_attention(q, k, v, pos, pos, method, block_size=4, **kw)
    ref = naive_method_attention(q, k, v, pos, pos, method, **kw)
    torch.testing.assert_close(fast, ref)
    w = torch.randn_like(ref)
    g1 = torch.autograd.grad((fast * w).sum(), [q, k, v, *params])
    g2 = torch.autograd.grad((ref * w).sum(), [q, k, v, *params])
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b)


def test_method_changes_attention_beyond_the_window():
    """The map is not the identity: self-extend differs from plain rope once i - j reaches the window."""
    q, k, v = _qkv(12)
    pos, inv = torch.arange(12), rope_inv_freq(8, 10000.0)
    a = method_attention(q, k, v, pos, pos, Method("self-extend", window=4, group=2), inv_freq=inv)
    b = method_attention(q, k, v, pos, pos, Method("self-extend", window=12, group=2), inv_freq=inv)
    torch.testing.assert_close(a[..., :4, :], b[..., :4, :])
    assert (a[..., 4:, :] - b[..., 4:, :]).abs().max() > 1e-3


@pytest.mark.parametrize(
    "spec",
    [
        "self-extend:group=2,window=3",
        "lm-infinite:n_global=2,window=4",
        "sinks:n_sink=2,window=4",
        "dual-chunk:chunk=4,local=1",
    ],
)
@pytest.mark.parametrize("encoding", ["rope", "alibi", "t5"])
def test_decoding_equals_the_parallel_forward(spec, encoding):
    model = _model(encoding)
    set_method(model, spec)
    tokens = torch.randint(0, 32, (2, 19), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(tokens)
        cache = Cache(2)
        steps = [model.decode(tokens[:, :6], cache)] + [model.decode(tokens[:, t : t + 1], cache) for t in range(6, 19)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


def test_sinks_cache_stays_bounded_and_evicted_tokens_are_gone():
    model = _model("rope")
    set_method(model, "sinks:n_sink=2,window=6")
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, 32, (1, 60), generator=g)
    cache, sizes = Cache(2), []
    with torch.no_grad():
        for t in range(60):
            model.decode(tokens[:, t : t + 1], cache)
            sizes.append(cache.nbytes())
        assert [layer.length for layer in cache.layers] == [8, 8] and cache.length == 60
        assert cache.layers[0].pos.tolist() == [0, 1, 54, 55, 56, 57, 58, 59]
        assert len(set(sizes[20:])) == 1  # flat after the buffers reached n_sink + W + 1 rows
        # changing an evicted token changes nothing at the end; changing a sink does
        last = model.decode(tokens[:, -1:], cache)
        for where, same in ((30, True), (0, False)):
            other = tokens.clone()
            other[0, where] = (other[0, where] + 1) % 32
            c = Cache(2)
            for t in range(60):
                model.decode(other[:, t : t + 1], c)
            out = model.decode(other[:, -1:], c)
            assert torch.allclose(out, last) == same


def test_generate_with_sinks_runs_past_the_training_length():
    model = _model("rope")
    set_method(model, "sinks:n_sink=2,window=6")
    out = model.generate(torch.tensor([1, 2, 3]), 40, temperature=0)
    assert out.shape == (43,)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("self-extend:group=0", r"group must be an integer in \[1, 2147483647\]"),
        ("nope:x=1", "unknown method 'nope'"),
        ("sinks:window=4,group=2", "unknown parameter 'group'"),
        ("lm-infinite:n_global=-1", r"n_global must be an integer in \[0, 2147483647\]"),
        ("dual-chunk:chunk=0", r"chunk must be an integer in \[1, "),
        ("dual-chunk:local=-1", r"local must be an integer in \[0, "),
        ("dual-chunk:window=4", "unknown parameter 'window' .valid: chunk, local."),
        ("sinks:window=100000000000000000000", r"window must be an integer in \[1, 2147483647\], got 1000"),
        ("self-extend:group=9223372036854775807", r"group must be an integer in \[1, 2147483647\]"),
    ],
)
def test_bad_specs(spec, message):
    with pytest.raises(PosencError, match=message):
        parse(spec, 64)


@pytest.mark.parametrize("encoding", ["fire", "nope", "rope+alibi", "acc-rand-qkv:a=1"])
def test_refused_schemes(encoding):
    with pytest.raises(PosencError, match="applies to rope .fixed-frequency schedules., alibi, t5 and kerple"):
        set_method(_model(encoding), "self-extend")


def test_defaults_and_label():
    assert parse("sinks", 64).label() == "sinks:n_sink=4,window=60"
    assert parse("self-extend:group=8", 64).label() == "self-extend:group=8,window=32"
    assert parse("lm-infinite", 64).label() == "lm-infinite:n_global=10,window=64"
    # ChunkLlama's defaults at L = 4096 (chunk_size 3L/4 = 3072, local_window L/16 = 256, chunk_len 2816)
    assert parse("dual-chunk", 4096) == Method("dual-chunk", window=2816, chunk=2816, local=256)
    assert parse("dual-chunk:local=32", 128).label() == "dual-chunk:chunk=64,local=32"
    assert parse("dual-chunk", 128).describe() == "dual-chunk(chunk=88,local=8)"


def test_bad_values_are_checked_before_the_default_window():
    with pytest.raises(PosencError, match=r"n_sink must be an integer in \[0, 2147483647\], got 'x'"):
        parse("sinks:n_sink=x", 64)
    with pytest.raises(
        PosencError,
        match=r"window must be an integer in \[1, 2147483647\], got 0 "
        r"\(default: from the training length 64, n_sink=64\)",
    ):
        parse("sinks:n_sink=64", 64)


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory):
    """A 4-step RoPE run of the quick preset (train length 32)."""
    from posenc.cli.main import main

    run = tmp_path_factory.mktemp("rope") / "run"
    assert main(["train", "--scheme", "rope", "--preset", "quick", "--steps", "4", "--out", str(run)]) == 0
    return run


def _cli(capsys, *argv):
    from posenc.cli.main import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_eval_records_the_method(rope_run, capsys):
    from posenc.store.records import load

    code, out, err = _cli(
        capsys,
        "eval",
        str(rope_run),
        "--multiples",
        "1",
        "4",
        "--max-tokens",
        "64",
        "--rope-schedule",
        "ntk",
        "--factor",
        "2",
        "--method",
        "self-extend:group=4",
    )
    assert code == 0 and "scheme: rope+ntk(s=2)+self-extend(group=4,window=16)" in out, err
    rows = [r for r in load(rope_run / "eval.jsonl") if r.kind == "ppl"]
    assert [(r.method, r.eval_length) for r in rows] == [
        ("self-extend:group=4,window=16", 32),
        ("self-extend:group=4,window=16", 128),
    ]
    assert all(r.ppl > 1 for r in rows)


def test_generate_with_sinks(rope_run, capsys):
    code, out, err = _cli(
        capsys,
        "generate",
        str(rope_run),
        "--prompt",
        "To be",
        "--max-new-tokens",
        "80",
        "--method",
        "sinks:n_sink=4,window=12",
    )
    assert code == 0 and out.startswith("To be") and len(out) > len("To be") + 40, err


def test_generate_with_a_rope_schedule_and_a_method(rope_run, capsys, monkeypatch):
    """posenc generate RUN --schedule yarn --factor 4 --beta-fast 16 (extend's schedule flags) hands posenc.rope's
    parameters to with_rope_schedule, then applies the method, and prints that model's continuation."""
    from posenc.cli import generate_cmd
    from posenc.model import with_rope_schedule
    from posenc.train.rundir import load_run

    calls = []

    def schedule(m, name, params):
        calls.append((name, params))
        return with_rope_schedule(m, name, params)

    def method(m, spec):
        calls.append((m.cfg.encoding_params["schedule"], spec))  # on the model with the schedule
        return set_method(m, spec)

    monkeypatch.setattr(generate_cmd, "with_rope_schedule", schedule)
    monkeypatch.setattr(generate_cmd, "set_method", method)
    code, out, err = _cli(
        capsys,
        "generate",
        str(rope_run),
        "--prompt",
        "To be",
        "--max-new-tokens",
        "40",
        "--temperature",
        "0",
        "--schedule",
        "yarn",
        "--factor",
        "4",
        "--beta-fast",
        "16",
        "--method",
        "self-extend:group=2",
        "--no-separator",
    )
    assert calls == [("yarn", {"factor": 4.0, "beta_fast": 16.0}), ("yarn", "self-extend:group=2")]
    model, _, _ = load_run(rope_run)
    model, _ = with_rope_schedule(model, "yarn", {"factor": 4.0, "beta_fast": 16.0})
    set_method(model, "self-extend:group=2")
    ids = model.generate(torch.tensor(list(b"To be")), 40, temperature=0)
    assert code == 0 and out == bytes(ids.tolist()).decode("utf-8", errors="replace") + "\n", err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--method", "self-extend:grp=4"], "method 'self-extend': unknown parameter 'grp' (valid: group, window)"),
        (
            ["--method", "streaming"],
            "unknown method 'streaming' (methods: self-extend, lm-infinite, sinks, dual-chunk)",
        ),
        (
            ["--rope-schedule", "rerope", "--rerope-window", "8", "--method", "sinks"],
            "method sinks applies to rope (fixed-frequency schedules), alibi, t5 and kerple",
        ),
    ],
)
def test_eval_bad_method_one_line_exit_2(rope_run, capsys, argv, message):
    code, out, err = _cli(capsys, "eval", str(rope_run), "--multiples", "1", "--max-tokens", "64", *argv)
    assert code == 2 and err.count("\n") == 1 and err.startswith("posenc: error: ") and message in err, (out, err)


def test_compare_evaluates_eval_methods_on_the_schemes_they_apply_to(tmp_path, capsys):
    from posenc.store.records import load

    preset = tmp_path / "methods.yaml"
    preset.write_text(
        "name: methods\nmodel: {n_layer: 1, n_head: 2, d_model: 32, train_length: 16}\n"
        "train: {steps: 3, batch_size: 2, lr: 3.0e-3, warmup: 1, ckpt_every: 3}\n"
        "eval: {multiples: [1, 4], max_tokens: 64, passkey: {trials: 0}, far_mass: {multiples: []}}\n"
        "schemes: [nope, rope, alibi]\neval_methods: ['lm-infinite:n_global=2']\n"
    )
    code, out, err = _cli(capsys, "compare", "--preset", str(preset), "--out", str(tmp_path / "out"))
    assert code == 0, err
    rows = {
        (r.scheme, r.method, r.eval_length)
        for r in load(tmp_path / "out" / "methods" / "results.jsonl")
        if r.kind == "ppl"
    }
    method_rows = {r for r in rows if r[1] is not None}
    label = "lm-infinite:n_global=2,window=16"
    assert method_rows == {
        (f"{s}+lm-infinite(n_global=2,window=16)", label, L) for s in ("rope", "alibi") for L in (16, 64)
    }


def test_block_keys_cover_every_visible_key_and_skip_the_hidden_middle():
    k_pos = torch.arange(100)
    for method in METHODS:
        for lo in range(0, 100, 7):
            hi = min(lo + 6, 99)
            keys = set(block_keys(method, k_pos, lo, hi).tolist())
            i = torch.arange(lo, hi + 1)[:, None]
            seen = set(torch.nonzero(method.visible(i, k_pos[None, :]).any(0)).flatten().tolist())
            assert seen <= keys and keys <= set(range(hi + 1))
            if method.name not in ("self-extend", "dual-chunk") and lo > 20:  # the others see every key
                assert len(keys) <= (method.n_global or method.n_sink) + method.window + 6


def test_streaming_nll_equals_the_parallel_streaming_definition_with_flat_memory():
    model = _model("rope")
    set_method(model, "sinks:n_sink=2,window=6")
    text = torch.randint(0, 32, (200,), generator=torch.Generator().manual_seed(3))
    nll, peak = model.streaming_nll(text, chunk=5)
    with torch.no_grad():
        ref = model.token_nll(text[None, :-1], text[None, 1:])[0]
    torch.testing.assert_close(nll, ref.to(nll.dtype))
    _, peak_long = model.streaming_nll(torch.cat((text, text, text)), chunk=5)
    assert peak_long == peak  # three times the text, the same cache


@pytest.mark.parametrize("scheme", ["alibi", "t5", "kerple", "rope"])
def test_streaming_under_sinks_keeps_the_distance_table_bounded_and_counts_it(scheme, monkeypatch):
    """Each step's distance table spans the kept n_sink + W = 8 distances, not the absolute position (it once
    grew to T: O(T) memory; RoPE builds none); the values are the unbounded table's; the reported peak is the
    cache's plus the table's bytes, the same for 3x the text."""
    from posenc import methods

    model = _model(scheme)
    method = set_method(model, "sinks:n_sink=2,window=6")
    text = torch.randint(0, 32, (200,), generator=torch.Generator().manual_seed(3))
    sizes, build = [], methods.distance_table
    monkeypatch.setattr(
        methods, "distance_table", lambda bias_of, n, device=None: sizes.append(n) or build(bias_of, n, device)
    )
    nll, peak = model.streaming_nll(text, chunk=5)
    assert max(sizes, default=0) == (0 if scheme == "rope" else 8)
    _, peak_long = model.streaming_nll(torch.cat((text, text, text)), chunk=5)
    assert peak_long == peak and max(sizes, default=0) == (0 if scheme == "rope" else 8)
    x = torch.zeros(1, 1, 16, dtype=torch.float64)
    table = max(methods.table_nbytes(b.attn.enc, method, x) for b in model.blocks)
    assert table == (0 if scheme == "rope" else 2 * 8 * 8)  # 2 heads x 8 distances, float64
    monkeypatch.setattr(methods, "table_nbytes", lambda *a: 0)
    assert model.streaming_nll(text, chunk=5)[1] == peak - table

    def unbounded(m, q, k):  # the reach before: each region's largest query less its smallest key position
        return max(0, *(int(a.max() - b.min()) for a, b in zip(m.query_positions(q), m.key_positions(k))))

    monkeypatch.setattr(methods.Method, "reach", unbounded)
    torch.testing.assert_close(model.streaming_nll(text, chunk=5)[0], nll, rtol=0, atol=1e-12)


def test_streaming_nll_needs_sinks():
    model = _model("rope")
    with pytest.raises(PosencError, match="needs a bounded cache"):
        model.streaming_nll(torch.arange(10))
    set_method(model, "lm-infinite")
    with pytest.raises(PosencError, match="needs a bounded cache"):
        model.streaming_nll(torch.arange(10))


def test_eval_stream_records_one_row_with_flat_cache(rope_run, capsys):
    from posenc.store.records import load

    sizes = []
    for n in (600, 1800):
        code, out, err = _cli(capsys, "eval", str(rope_run), "--method", "sinks:n_sink=2,window=14", "--stream", str(n))
        assert code == 0 and "scheme: rope+sinks(n_sink=2,window=14) streamed" in out, err
        rec = [r for r in load(rope_run / "eval.jsonl") if r.kind == "ppl"][-1]
        assert (rec.eval_length, rec.scored_tokens, rec.method, len(rec.bucket_ppl)) == (
            n,
            n,
            "sinks:n_sink=2,window=14",
            8,
        )
        assert (rope_run / "stream_sinks_n_sink=2_window=14.png").stat().st_size > 0
        sizes.append(rec.note)
    assert sizes[0] == sizes[1]  # the same peak cache for three times the text
    code, _, err = _cli(capsys, "eval", str(rope_run), "--stream", "100")
    assert code == 2 and "needs a bounded cache" in err


@pytest.mark.parametrize("encoding", ["rope", "rope:pairing=adjacent,rotary_fraction=0.5", "alibi", "t5", "kerple"])
@pytest.mark.parametrize(
    "spec",
    [
        "self-extend:group=3,window=40",
        "lm-infinite:n_global=1,window=40",
        "sinks:n_sink=1,window=40",
        "dual-chunk:chunk=40,local=0",
    ],
)
def test_a_window_past_the_text_is_the_plain_model(encoding, spec):
    """With W >= T every map is i - j and every key visible: the method's path equals the core's own forward."""
    model = _model(encoding, train_length=48, n_kv_head=1)  # the windows fit the trained length (check_reach)
    tokens = torch.randint(0, 32, (2, 21), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        plain = model(tokens)
        set_method(model, spec)
        torch.testing.assert_close(model(tokens), plain)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("self-extend:window=9", "method self-extend: window = 9 passes the trained length 8"),
        ("lm-infinite:window=9", "method lm-infinite: window = 9 passes the trained length 8"),
        ("sinks:n_sink=2,window=7", "method sinks: n_sink + window = 9 passes the trained length 8"),
        ("dual-chunk:chunk=6,local=3", "method dual-chunk: chunk + local = 9 passes the trained length 8"),
    ],
)
def test_a_method_keeping_exact_positions_past_the_trained_length_is_refused(spec, message):
    """Up to its window a method is plain attention: past the training length those positions were never trained,
    and below it the row would carry the method's name without its mechanism. A RoPE schedule's factor widens it."""
    model = _model("rope")
    with pytest.raises(PosencError, match="^" + re.escape(message) + ";"):
        set_method(model, spec)
    set_method(model, spec.replace("9", "8").replace("=7", "=6").replace("=3", "=2"))  # at the length: accepted
    scaled, _ = with_rope_schedule(model, "pi", {"factor": 2.0})
    assert set_method(scaled, spec).exact == 9


@pytest.mark.parametrize("scheme", ["rope", "alibi"])
@pytest.mark.parametrize("spec", ["sinks:n_sink=2,window=4", "self-extend:group=2,window=4", "lm-infinite"])
def test_attention_set_method_takes_a_spec_as_the_method_it_parses(scheme, spec):
    """A spec string was stored as is (the forward then raised AttributeError): it is parsed from the layer's
    train_length and checked as ``posenc.model.set_method`` does; the output is the Method object's."""
    import posenc

    layer = posenc.Attention(16, 2, scheme, train_length=8)
    x = torch.randn(1, 13, 16, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        assert layer.set_method(spec) == parse(spec, 8)
        by_spec = layer(x)
        layer.set_method(parse(spec, 8))
        torch.testing.assert_close(layer(x), by_spec)
        layer.set_method(None)
        assert not torch.allclose(layer(x), by_spec)  # the method acts past its window
    scaled = posenc.Attention(
        16, 2, "rope", train_length=8, params={"schedule": "pi", "schedule_params": {"factor": 2.0}}
    )
    assert scaled.set_method("sinks:n_sink=2,window=14").exact == 16  # a RoPE schedule's factor widens the reach


def test_grouped_query_decoding_with_a_method():
    model = _model("rope", n_kv_head=1)
    set_method(model, "self-extend:group=2,window=4")
    tokens = torch.randint(0, 32, (1, 15), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        full, cache = model(tokens), Cache(2)
        steps = [model.decode(tokens[:, t : t + 1], cache) for t in range(15)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


def test_a_bounded_cache_refuses_crop():
    model = _model("rope")
    set_method(model, "sinks:n_sink=1,window=3")
    cache = Cache(2)
    with torch.no_grad():
        model.decode(torch.arange(10)[None], cache)
    with pytest.raises(PosencError, match="cannot be cropped"):
        cache.crop(5)


@pytest.mark.parametrize("G, W, T", [(2, 4, 8), (4, 16, 100), (3, 7, 50)])
def test_self_extend_largest_position(G, W, T):
    """The largest relative position over T tokens is (T - 1) // G + W - W // G (the key j = 0)."""
    d, _ = relative_positions(
        Method("self-extend", window=W, group=G), torch.arange(T)[:, None], torch.arange(T)[None, :]
    )
    assert int(d.max()) == (T - 1) // G + W - W // G
