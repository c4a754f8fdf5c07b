"""Self-Extend and LM-Infinite on a pretrained Llama (posenc.hf.long_context; a tiny random one built here):
the installed model's logits equal a naive float64 reference whose attention rotates each query by the method's
relative position d(i, j) (``posenc.methods.relative_positions``, full matrix), with the model's frequencies or a
schedule's; a window >= T reproduces the unmodified model; cached greedy decoding equals full recomputation;
padded batches, sinks and bad specs are one-line errors; ``posenc generate MODEL --method`` runs it."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from test_generation import L0, llama  # noqa: E402  (the tiny random Llama, native context L0 = 16)

from posenc import methods  # noqa: E402
from posenc.cli.main import main  # noqa: E402
from posenc.errors import PosencError  # noqa: E402
from posenc.eval import perplexity as ev  # noqa: E402
from posenc.hf import generation, loading  # noqa: E402
from posenc.hf.adaptation import Adaptation  # noqa: E402
from posenc.hf.schedules import Extension  # noqa: E402
from posenc.hf.sink_cache import sink_cache  # noqa: E402

T = 40  # the input: longer than L0


def adapted(schedule: str | None, spec: str | None, dtype=torch.float32) -> Adaptation:
    a = Adaptation(llama().to(dtype))
    if schedule is not None:
        a.set_schedule(Extension(schedule, factor=4.0))
    if spec is not None:
        a.set_method(spec)
    return a


def _rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def naive_attention(method, inv_freq, mscale, module, query, key, value, attention_mask, scaling, **kwargs):
    """Reference: every score <R(d(i, j)) q_i, k_j> with d from ``methods.relative_positions`` (Tq x Tk x D), float64;
    q, k unrotated (the installed model's IdentityRotary), ``inv_freq`` and ``mscale`` transformers' own."""
    q, k, v = (t.double() for t in (query, key, value))
    k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    tq, tk = q.shape[-2], k.shape[-2]
    d, visible = methods.relative_positions(method, torch.arange(tk - tq, tk)[:, None], torch.arange(tk)[None])
    angle = d[..., None].double() * inv_freq.double()  # (Tq, Tk, D/2)
    cos, sin = torch.cat((angle.cos(), angle.cos()), -1), torch.cat((angle.sin(), angle.sin()), -1)
    rotated = q[:, :, :, None] * cos + _rotate_half(q)[:, :, :, None] * sin  # (B, H, Tq, Tk, D)
    s = (rotated * k[:, :, None]).sum(-1) * scaling * mscale**2
    out = s.masked_fill(~visible, float("-inf")).softmax(-1) @ v
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


def reference(schedule, spec) -> Adaptation:
    """The float64 model with the same method, its attention the naive one at transformers' frequencies."""
    from transformers import AttentionInterface

    a = adapted(schedule, spec, torch.float64)
    AttentionInterface.register(
        "test_naive_method", functools.partial(naive_attention, a.method, *native_inv_freq(schedule))
    )
    a.model.set_attn_implementation("test_naive_method")
    return a


def native_inv_freq(schedule):
    """The frequencies transformers' own rotary embedding takes for ``schedule`` (None: the model's)."""
    a = adapted(schedule, None)
    return a.model.model.rotary_emb.inv_freq.float(), float(a.model.model.rotary_emb.attention_scaling)


@pytest.mark.parametrize("schedule", [None, "ntk", "yarn"])
@pytest.mark.parametrize(
    "spec",
    [
        "self-extend:group=3,window=6",
        "lm-infinite:n_global=2,window=10",
        "dual-chunk:chunk=7,local=2",
        "sinks:n_sink=2,window=9",
    ],
)
def test_logits_equal_the_naive_reference(schedule, spec):
    ids = torch.randint(0, 128, (2, T))
    a = adapted(schedule, spec)
    with torch.no_grad():
        got, ref = a.model(ids, use_cache=False).logits, reference(schedule, spec).model(ids, use_cache=False).logits
        plain = adapted(schedule, None).model(ids, use_cache=False).logits
    assert torch.allclose(got.double(), ref, atol=2e-5, rtol=1e-4)
    assert (got - plain).abs().max() > 1e-3  # the method acts at T > window
    if schedule is not None:  # the schedule's frequencies (and yarn's scaling), not the model's
        assert not torch.allclose(*(native_inv_freq(s)[0] for s in (schedule, None)))


@pytest.mark.parametrize(
    "spec", ["self-extend:group=3,window=6", "lm-infinite:n_global=2,window=10", "dual-chunk:chunk=7,local=2"]
)
def test_gradients_equal_the_naive_reference(spec):
    ids = torch.randint(0, 128, (1, T))
    fast, ref = adapted("ntk", spec), reference("ntk", spec)
    for a in (fast, ref):
        a.model(ids, use_cache=False).logits.logsumexp(-1).sum().backward()
    for name in ("q_proj", "k_proj", "v_proj"):
        got, want = (getattr(a.model.model.layers[0].self_attn, name).weight.grad for a in (fast, ref))
        assert torch.allclose(got.double(), want, atol=1e-5, rtol=1e-4), name


@pytest.mark.parametrize("schedule", ["ntk", "pi"])  # x4: they reach 64 positions, the window 40 (check_reach)
@pytest.mark.parametrize(
    "spec", [f"self-extend:group=4,window={T}", f"lm-infinite:n_global=0,window={T}", f"dual-chunk:chunk={T},local=0"]
)
def test_a_window_covering_the_input_reproduces_the_model(schedule, spec):
    ids = torch.randint(0, 128, (2, T))
    with torch.no_grad():
        got = adapted(schedule, spec).model(ids).logits
        plain = adapted(schedule, None).model(ids).logits
    assert torch.allclose(got, plain, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "spec",
    [
        "self-extend:group=2,window=4",
        "lm-infinite:n_global=1,window=6",
        "dual-chunk:chunk=5,local=1",
        "sinks:n_sink=2,window=5",
    ],
)
def test_cached_greedy_decoding_equals_full_recomputation(spec):
    a, ids = adapted("ntk", spec), torch.randint(0, 128, (9,))
    a.model.generation_config.eos_token_id = None  # the random model's id 2 would stop it early
    seen = []
    a.model.model.register_forward_pre_hook(lambda m, args, kw: seen.append(kw["input_ids"].shape[1]), with_kwargs=True)
    out = generation.generate(a, ids, 14)
    assert seen == [9] + [1] * 13  # through the KV cache
    assert torch.equal(out, generation.greedy_reference(a.model, ids, 14))


def test_restore_undoes_the_method_and_the_key_names_it():
    ids = torch.randint(0, 128, (1, T))
    a = adapted(None, None)
    with torch.no_grad():
        plain, key = a.model(ids).logits, a.key(T)
        a.set_method("self-extend:group=2,window=4")
        assert a.key(T) != key
        a.restore()
        assert a.method is None and a.key(T) == key and torch.equal(a.model(ids).logits, plain)


@pytest.mark.parametrize("schedule", [None, "ntk"])
def test_a_bf16_model_rotates_at_float32_frequencies(schedule):
    a = adapted(schedule, "self-extend:group=2,window=4", torch.bfloat16)
    assert torch.equal(a.model.model.rotary_emb.inv_freq, native_inv_freq(schedule)[0])  # float32, not bf16's
    ids = torch.randint(0, 128, (1, T))
    with torch.no_grad():
        got, want = a.model(ids).logits, adapted(schedule, "self-extend:group=2,window=4").model(ids).logits
    assert got.dtype == torch.bfloat16 and torch.allclose(got.float(), want, atol=0.1)


def test_defaults_come_from_the_native_context():
    assert adapted(None, "self-extend").method == methods.Method("self-extend", window=L0 // 2, group=4)
    assert adapted(None, "lm-infinite").method == methods.Method("lm-infinite", window=L0, n_global=10)


@pytest.mark.parametrize(
    "schedule, spec, message",
    [
        (None, "self-extend:group=0", r"group must be an integer in \[1, "),
        (None, "nosuch", "unknown method 'nosuch'"),
        ("rerope", "self-extend", "the model has schedule rerope"),
        ("dynamic", "lm-infinite", "the model has schedule dynamic"),
    ],
)
def test_unsupported_settings_are_refused(schedule, spec, message):
    a = Adaptation(llama())
    if schedule is not None:
        a.set_schedule(Extension(schedule, factor=2.0, window=4 if schedule == "rerope" else None))
    with pytest.raises(PosencError, match=message):
        a.set_method(spec)


def test_a_padded_batch_is_refused():
    a, ids = adapted(None, "self-extend:group=2,window=4"), torch.randint(0, 128, (2, 12))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with pytest.raises(PosencError, match="unpadded rows only"):
        a.model(ids, attention_mask=mask)
    a.model(ids, attention_mask=torch.ones_like(ids))  # an all-ones mask is honoured


@pytest.mark.parametrize(
    "spec",
    [
        "self-extend:group=3,window=6",
        "lm-infinite:n_global=2,window=10",
        "dual-chunk:chunk=7,local=2",
        "sinks:n_sink=2,window=5",
    ],
)
def test_explicit_position_ids_are_honoured_in_order_and_refused_otherwise(spec):
    """The method assigns positions itself: position_ids equal to the positions in order (after the cache's) give
    the logits of none; gapped or shifted ones are one line, not ignored."""
    a, ids = adapted(None, spec), torch.randint(0, 128, (1, 20))
    with torch.no_grad():
        plain = a.model(ids).logits
        assert torch.equal(a.model(ids, position_ids=torch.arange(20)[None]).logits, plain)
        for bad in (torch.arange(20)[None] * 2, torch.arange(1, 21)[None]):
            with pytest.raises(PosencError, match=f"^{spec.split(':')[0]} on a pretrained model places the new") as exc:
                a.model(ids, position_ids=bad)
            assert "\n" not in str(exc.value)
        cache = sink_cache(a.model, a.method) if a.method.bounded else transformers.DynamicCache()
        first = a.model(ids[:, :12], cache=cache, use_cache=True).logits
        step = a.model(ids[:, 12:13], cache=cache, use_cache=True, position_ids=torch.tensor([[12]])).logits
        assert torch.allclose(torch.cat((first, step), 1), plain[:, :13], atol=1e-5)
        with pytest.raises(PosencError, match="positions 13..13 in order"):
            a.model(ids[:, 13:14], cache=cache, use_cache=True, position_ids=torch.tensor([[20]]))


def test_a_sliding_window_model_is_refused():
    torch.manual_seed(0)
    cfg = transformers.MistralConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=L0,
        sliding_window=8,
    )
    a = Adaptation(transformers.MistralForCausalLM(cfg).eval())
    a.set_method("self-extend:group=2,window=4")
    with pytest.raises(PosencError, match="sliding window of 8 tokens"):
        a.model(torch.randint(0, 128, (1, 12)))


PROMPT = "The pass key is 1 2 3 . Remember it"


def test_cli_generates_with_the_method(llama_dir, capsys):
    spec = "self-extend:group=2,window=4"
    code = main(
        [
            "generate",
            str(llama_dir / "tiny"),
            "--prompt",
            PROMPT,
            "--max-new-tokens",
            "6",
            "--temperature",
            "0",
            "--schedule",
            "ntk",
            "--factor",
            "2",
            "--method",
            spec,
            "--no-separator",
        ]
    )
    out, err = capsys.readouterr()
    loaded = loading.load(str(llama_dir / "tiny"))
    a = Adaptation(loaded.model)
    a.set_schedule(Extension("ntk", factor=2.0))
    a.set_method(spec)
    ids = torch.tensor(loaded.tokenizer(PROMPT)["input_ids"])
    ref = generation.greedy_reference(a.model, ids, 6, eos_token_id=loaded.model.generation_config.eos_token_id)
    assert code == 0 and out == loaded.tokenizer.decode(ref.tolist(), skip_special_tokens=True) + "\n"
    assert "self-extend(group=2,window=4)" in err


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--method", "self-extend:group=x"], "group must be an integer"),
        (["--method", "self-extend", "--scheme", "alibi"], "--method applies to native RoPE or a --schedule"),
    ],
)
def test_cli_bad_method_is_one_line(llama_dir, capsys, flags, message):
    code = main(["generate", str(llama_dir / "tiny"), "--prompt", "x", *flags])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and message in err, err


def test_extend_scores_each_method_as_direct_scoring_does(llama_dir, tmp_path, capsys):
    """posenc extend --method: a row per method whose NLL at each length is the window's score under
    Adaptation.set_method (on its schedule), and the schedules' rows unchanged by it."""
    from posenc.jobs import extend

    specs = ["self-extend:group=2,window=4", "ntk+dual-chunk:chunk=8,local=2", "sinks:n_sink=2,window=6"]
    argv = ["extend", "--model", str(llama_dir / "tiny"), "--corpus", str(llama_dir / "corpus.txt")]
    argv += ["--out", str(tmp_path / "o"), "--schedules", "none", "ntk", "--factor", "2", "--lengths", "16", "32"]
    argv += ["--max-windows", "2", "--passkey-lengths", "80", "--method", *specs]
    assert main(argv) == 0
    records = [json.loads(line) for line in (tmp_path / "o" / "records.jsonl").read_text().splitlines()]
    labels = ["self-extend(group=2,window=4)", "ntk+dual-chunk(chunk=8,local=2)", "sinks(n_sink=2,window=6)"]
    assert {r["adaptation"] for r in records} == {"none", "ntk", *labels}
    assert set(labels) <= {r["adaptation"] for r in records if r["kind"] == "passkey"}
    assert all(label in (tmp_path / "o" / "results.md").read_text() for label in labels)
    cfg = extend.load_extend_config(
        "quick", {"model": str(llama_dir / "tiny"), "corpus": str(llama_dir / "corpus.txt"), "lengths": [16, 32]}
    )
    loaded = loading.load(cfg.model)
    _, docs, plan, bos_id = extend.eval_inputs(cfg.model_copy(update={"max_windows": 2}), loaded, extend.held_out(cfg))
    a = Adaptation(loaded.model)
    for spec, label in zip(specs, labels):
        schedule, method = extend.split_method(spec)
        a.set_schedule(Extension(schedule, 2.0))
        a.set_method(method)
        for L in (16, 32):
            got = [
                r["nll_sum"] for r in records if r["kind"] == "ppl" and r["adaptation"] == label and r["length"] == L
            ]
            want = [
                ev.score_window(a.model, dict(docs)[doc], win, bos_id, ev.bucket_width(L))["nll_sum"]
                for doc, win in plan[L]
            ]
            assert len(want) == 2 and got == pytest.approx(want, rel=1e-6)
        a.restore()
    plain = {
        (r["length"], r["begin"]): r["nll_sum"] for r in records if r["adaptation"] == "none" and r["kind"] == "ppl"
    }
    a.set_schedule(Extension("none", 2.0))
    for doc, win in plan[32]:
        assert plain[32, win.begin] == pytest.approx(
            ev.score_window(a.model, dict(docs)[doc], win, bos_id, ev.bucket_width(32))["nll_sum"], rel=1e-6
        )


@pytest.mark.parametrize(
    "spec, message",
    [
        ("sinks:n_sink=-1", "n_sink must be an integer in [0, "),
        ("dynamic+self-extend", "a method goes on native RoPE or a fixed-frequency schedule"),
        ("nosuch+self-extend", "nosuch"),
        ("self-extend:group=x", "group must be an integer"),
    ],
)
def test_extend_bad_method_is_one_line(llama_dir, tmp_path, capsys, spec, message):
    argv = ["extend", "--model", str(llama_dir / "tiny"), "--corpus", str(llama_dir / "corpus.txt")]
    code = main([*argv, "--out", str(tmp_path / "o"), "--lengths", "16", "--method", spec])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and message in err and not (tmp_path / "o").exists(), err


def test_the_bounded_cache_holds_the_sinks_and_the_window_only():
    """Decoding under sinks: each layer keeps n_sink + window - 1 keys between steps, the first n_sink and the
    last window - 1 fed (their unrotated keys, as the full forward computes them)."""
    from posenc.hf.sink_cache import sink_cache

    a, ids = adapted(None, "sinks:n_sink=2,window=5"), torch.randint(0, 128, (1, 12))
    cache = sink_cache(a.model, a.method)
    with torch.no_grad():
        a.model(ids[:, :7], past_key_values=cache, use_cache=True)
        for t in range(7, 12):
            a.model(ids[:, t : t + 1], past_key_values=cache, use_cache=True)
        full = sink_cache(a.model, methods.parse("sinks:n_sink=100,window=100", L0))  # evicts nothing
        a.model(ids, past_key_values=full, use_cache=True)
    assert cache.get_seq_length() == 12 and all(layer.keys.shape[-2] == 6 for layer in cache.layers)
    kept = [0, 1, 8, 9, 10, 11]
    for layer, whole in zip(cache.layers, full.layers):
        assert torch.allclose(layer.keys, whole.keys[:, :, kept], atol=1e-5)
        assert torch.allclose(layer.values, whole.values[:, :, kept], atol=1e-5)


@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_streaming_nll_equals_the_full_forward_under_sinks(chunk):
    """The streaming definition: a text fed chunk by chunk through the bounded cache scores each token as the
    full forward under the sinks mask does; the cache stays at n_sink + window - 1 positions."""
    from posenc.hf.sink_cache import streaming_nll

    a, text = adapted(None, "sinks:n_sink=2,window=6"), torch.randint(0, 128, (50,))
    nll, peak = streaming_nll(a.model, a.method, text, chunk)
    with torch.no_grad():
        logits = a.model(text[None, :-1], use_cache=False).logits[0].float()
    want = torch.nn.functional.cross_entropy(logits, text[1:], reduction="none")
    cfg = a.model.config
    per_position = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim
    assert nll.shape == (49,) and torch.allclose(nll, want, atol=1e-4)
    assert peak == 7 * per_position * 4  # float32 keys and values of the 7 kept positions
    for bad in (0, 2.5, True):  # 2.5 was a TypeError from range, True taken for 1 (issue 59)
        with pytest.raises(PosencError, match=rf"^chunk must be an integer >= 1, got {bad}$"):
            streaming_nll(a.model, a.method, text, bad)
    with pytest.raises(PosencError, match=r"^streaming needs a \(T,\) tensor of token ids, T >= 2, got list$"):
        streaming_nll(a.model, a.method, text.tolist())


def test_extend_streams_the_held_out_text_through_the_sinks_cache(llama_dir, tmp_path, capsys):
    """posenc extend --stream N with a sinks method: the JSON's perplexity is the full forward's under the sinks
    mask over the first N targets of the held-out text joined; a rerun keeps it; --stream without sinks is refused."""
    from posenc.jobs import extend

    argv = ["extend", "--model", str(llama_dir / "tiny"), "--corpus", str(llama_dir / "corpus.txt")]
    argv += ["--out", str(tmp_path / "o"), "--schedules", "none", "--lengths", "16", "--max-windows", "1"]
    argv += ["--passkey-lengths", "80"]
    assert main([*argv, "--stream", "90"]) == 2 and "needs a bounded cache" in capsys.readouterr().err
    assert main([*argv, "--method", "sinks:n_sink=2,window=6", "--stream", "90"]) == 0
    path = tmp_path / "o" / "stream_sinks_n_sink=2_window=6_.json"
    got = json.loads(path.read_text())
    assert path.with_suffix(".png").stat().st_size > 0
    cfg = extend.load_extend_config(
        "quick", {"model": str(llama_dir / "tiny"), "corpus": str(llama_dir / "corpus.txt"), "lengths": [16]}
    )
    loaded = loading.load(cfg.model)
    _, docs, _, _ = extend.eval_inputs(cfg, loaded, extend.held_out(cfg))
    text = torch.as_tensor(np.concatenate([ids for _, ids in docs])[:91], dtype=torch.int64)
    a = Adaptation(loaded.model)
    a.set_method("sinks:n_sink=2,window=6")
    with torch.no_grad():
        logits = a.model(text[None, :-1], use_cache=False).logits[0].float()
    nll = torch.nn.functional.cross_entropy(logits, text[1:], reduction="none").double()
    assert got["targets"] == 90 and got["ppl"] == pytest.approx(float(nll.mean().exp()), rel=1e-5)
    assert len(got["bucket_ppl"]) == 8 and got["peak_cache_bytes"] > 0
    before = path.read_text()
    assert main([*argv, "--method", "sinks:n_sink=2,window=6", "--stream", "90"]) == 0
    assert path.read_text() == before  # kept: not streamed again
