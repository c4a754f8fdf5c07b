"""posenc as an lm-evaluation-harness model (posenc.jobs.harness, posenc.harness): the registry finds it, its
log-likelihoods are posenc's scoring of the same tokens, its generations posenc generate's, its errors one line."""

import json

import pytest
import torch

pytest.importorskip("lm_eval")  # the harness extra; CI installs it with the test extra
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.api.registry import get_model  # noqa: E402

from posenc.cli.main import main  # noqa: E402
from posenc.errors import PosencError  # noqa: E402
from posenc.eval import passkey, perplexity  # noqa: E402
from posenc.hf import loading  # noqa: E402
from posenc.hf.adaptation import Adaptation  # noqa: E402
from posenc.jobs import harness  # noqa: E402
from posenc.train.rundir import load_run  # noqa: E402

METHOD = "self-extend:group=2,window=16"


def _req(kind, *args):
    return Instance(request_type=kind, doc={}, arguments=args, idx=0)


def test_the_registry_finds_posenc_after_import():
    import posenc.harness

    assert get_model("posenc") is posenc.harness.PosencLM is harness.PosencLM


def test_model_args_join_a_spec_lm_eval_split_at_its_commas():
    args = harness.parse_model_args(
        {"pretrained": "smollm2", "schedule": "yarn", "factor": 4, "method": "self-extend:group=8", "window": 1024}
    )
    assert (args.schedule, args.settings, args.method) == ("yarn", {"factor": 4}, "self-extend:group=8,window=1024")
    assert harness.parse_model_args({"pretrained": "x", "method": None, "truncation": True}).method is None


def test_wilson_interval_values():
    assert harness.wilson(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    assert harness.wilson(1, 10) == pytest.approx((0.0179, 0.4042), abs=1e-4)


def _adapted(llama_dir, method=None):
    loaded = loading.load(str(llama_dir / "tiny"))
    adapted = Adaptation(loaded.model)
    if method:
        adapted.set_method(method)
    return loaded, adapted


@pytest.mark.parametrize("method", [None, METHOD])
def test_hf_loglikelihoods_equal_posencs_scoring(llama_dir, method):
    lm = harness.PosencLM(pretrained=str(llama_dir / "tiny"), **({"method": method} if method else {}))
    loaded, adapted = _adapted(llama_dir, method)
    tok = loaded.tokenizer
    context, continuation = passkey.FILLER * 3, " The pass key is 12345."
    ids = tok(context + continuation, add_special_tokens=False)["input_ids"]
    n = len(ids) - len(tok(context, add_special_tokens=False)["input_ids"])
    nll = perplexity.token_nll(adapted.model, torch.tensor(ids))
    ((ll, greedy),) = lm.loglikelihood([_req("loglikelihood", context, continuation)])
    assert ll == pytest.approx(-float(nll[-n:].sum()), abs=1e-4) and ll < -1 and greedy is False
    with pytest.raises(PosencError, match="has neither BOS nor EOS"):  # the word tokenizer: nothing to start after
        lm.loglikelihood_rolling([_req("loglikelihood_rolling", context)])


def test_own_run_loglikelihoods_equal_its_token_nll_and_generation_posenc_generates(tiny_corpus, tmp_path, capsys):
    run = tmp_path / "run"
    sets = [f"--set={k}" for k in ("model.n_layer=1", "model.n_head=2", "model.d_model=16", "model.train_length=16")]
    argv = ["train", "--scheme", "rope", "--preset", "quick", "--steps", "2", "--out", str(run)]
    assert main([*argv, f"--set=train.corpus={tiny_corpus}", "--set=train.batch_size=2", *sets]) == 0
    lm = harness.PosencLM(pretrained=str(run), schedule="pi", factor=4)
    model, _, _ = load_run(run)
    ref = lm.backend.model  # the run's weights under PI, as posenc eval --rope-schedule builds them
    context, continuation = "word3 word10 word7", " word19 word28"
    ids = lm.tok_encode(context + continuation)
    n = len(ids) - len(lm.tok_encode(context))
    x = torch.tensor(ids)
    with torch.no_grad():
        nll, native = (m.token_nll(x[None, :-1], x[None, 1:])[0] for m in (ref, model))
    ((ll, _),) = lm.loglikelihood([_req("loglikelihood", context, continuation)])
    assert ll == pytest.approx(-float(nll[-n:].sum()), abs=1e-5)
    assert float((native - nll).abs().max()) > 1e-5  # the schedule is in: PI at 4x changes the scores
    text = "word3 word10 word7 word19 word28 word3 word12"
    whole = torch.tensor([lm.prefix_token_id, *lm.tok_encode(text)])
    assert lm.prefix_token_id == 10  # byte tokens: the documents' separator "\n\n" ends in "\n"
    (rolling,) = lm.loglikelihood_rolling([_req("loglikelihood_rolling", text)])
    with torch.no_grad():
        expected = -float(ref.token_nll(whole[None, :-1], whole[None, 1:]).sum())
    assert rolling == pytest.approx(expected, abs=1e-4)
    capsys.readouterr()
    flags = ["--schedule", "pi", "--factor", "4", "--temperature", "0", "--max-new-tokens", "8", "--completion-only"]
    assert main(["generate", str(run), "--prompt", context, *flags]) == 0
    (out,) = lm.generate_until([_req("generate_until", context, {"until": [], "max_gen_toks": 8})])
    assert out == capsys.readouterr().out.removesuffix("\n") and out


def test_generate_until_equals_posenc_generate_and_stops(llama_dir, capsys):
    tiny = str(llama_dir / "tiny")
    config = llama_dir / "tiny" / "generation_config.json"  # no EOS: the random model would end at once
    config.write_text(json.dumps({**json.loads(config.read_text()), "eos_token_id": None}))
    prompt = passkey.TASK + " " + passkey.FILLER
    argv = ["generate", tiny, "--prompt", prompt, "--method", METHOD, "--temperature", "0", "--max-new-tokens", "12"]
    assert main([*argv, "--completion-only"]) == 0
    expected = capsys.readouterr().out.removesuffix("\n")
    lm = harness.PosencLM(pretrained=tiny, method=METHOD)
    (out,) = lm.generate_until([_req("generate_until", prompt, {"until": [], "max_gen_toks": 12})])
    assert out.strip() == expected.strip() and len(out.split()) >= 3
    stop = out.split()[2]
    (cut,) = lm.generate_until([_req("generate_until", prompt, {"until": [stop], "max_gen_toks": 12})])
    assert cut == out[: out.find(stop)] and stop not in cut


def test_one_line_errors(llama_dir):
    tiny = str(llama_dir / "tiny")
    with pytest.raises(PosencError, match="batch_size 1, got 4"):
        harness.PosencLM(pretrained=tiny, batch_size=4)
    if not torch.cuda.is_available():  # lm-eval's command asks for cuda:0 by default
        with pytest.warns(UserWarning, match="no CUDA device here, running on the CPU"):
            assert harness.PosencLM(pretrained=tiny, device="cuda:0").device == torch.device("cpu")
    with pytest.raises(PosencError, match="unknown key 'windw'"):
        harness.PosencLM(pretrained=tiny, windw=3)
    with pytest.raises(PosencError, match="factor is a schedule setting: it needs schedule=NAME"):
        harness.PosencLM(pretrained=tiny, factor=2)
    long = passkey.FILLER * 20  # 300+ tokens past the native 256
    lm = harness.PosencLM(pretrained=tiny)
    assert lm.max_length == 256
    with pytest.raises(PosencError, match=r"past what native RoPE reaches \(256 tokens\)"):
        lm.loglikelihood([_req("loglikelihood", long, " pass")])
    with pytest.raises(PosencError, match="'top_p' is not taken here"):
        lm.generate_until([_req("generate_until", "pass", {"until": [], "top_p": 0.9})])
    truncated = harness.PosencLM(pretrained=tiny, truncation=True)
    assert truncated.loglikelihood([_req("loglikelihood", long, " pass")])[0][0] < 0
    extended = harness.PosencLM(pretrained=tiny, method=METHOD)  # reach: 16 + (T - 16) / 2 < 256
    assert extended.max_length == 496
    assert harness.PosencLM(pretrained=tiny, schedule="yarn", factor=4).max_length == 1024


def test_the_grid_writes_one_table_and_resumes(llama_dir, tmp_path, monkeypatch, capsys):
    calls = []

    def cell(lm, task, length, limit, cache, tokenizer):
        calls.append((lm.args.method, lm.args.schedule, task, length))
        lo, hi = harness.wilson(7, 10)
        return {"metric": str(length), "score": 0.7, "n": 10, "low": lo, "high": hi, "seconds": 1.0}

    monkeypatch.setattr(harness, "run_cell", cell)
    out = tmp_path / "grid"
    argv = ["harness", "--model", str(llama_dir / "tiny"), "--tasks", "niah_single_1", "--lengths", "64", "128"]
    argv += ["--adaptations", "none", "yarn:factor=2", METHOD, "--limit", "10", "--out", str(out)]
    assert main(argv) == 0
    assert len(calls) == 6 and set(calls) == {
        (m, s, "niah_single_1", n) for m, s in [(None, None), (None, "yarn"), (METHOD, None)] for n in (64, 128)
    }
    table = (out / "table.md").read_text()
    assert "| yarn:factor=2 | 0.70 [0.40, 0.89] (n=10) | 0.70 [0.40, 0.89] (n=10) |" in table
    assert (out / "plot.png").stat().st_size > 0 and (out / "tokenizer" / "tokenizer_config.json").exists()
    assert main(argv) == 0 and len(calls) == 6  # every cell kept: nothing rerun
    assert len((out / "invocations.jsonl").read_text().splitlines()) == 2
    assert main([*argv[:-4], "--adaptations", "warp:factor=2", "--out", str(out)]) == 2
    assert "unknown" in capsys.readouterr().err
    assert "samples n; weights and compute in float32." in table
    assert {json.loads(c.read_text())["dtype"] for c in (out / "cells").glob("*.json")} == {"float32"}


def test_a_grid_keeps_one_dtype_per_folder(llama_dir, tmp_path, monkeypatch, capsys):
    """Each cell records the dtype its model ran in; a folder of float32 cells refuses a bfloat16 grid before any
    model loads (its cells would be mixed in one table), and a bfloat16 grid elsewhere passes bfloat16 to the
    model and says so in its table."""
    seen = []

    def cell(lm, task, length, limit, cache, tokenizer):
        seen.append(lm.args.dtype)
        return {"metric": str(length), "score": 1.0, "n": 2, "low": 0.34, "high": 1.0, "seconds": 1.0}

    monkeypatch.setattr(harness, "run_cell", cell)
    argv = ["harness", "--model", str(llama_dir / "tiny"), "--tasks", "niah_single_1", "--lengths", "64"]
    assert main([*argv, "--out", str(tmp_path / "f32")]) == 0 and seen == ["float32"]
    monkeypatch.setattr(harness.PosencLM, "__init__", lambda *a, **k: pytest.fail("a model loaded"))
    assert main([*argv, "--lengths", "128", "--dtype", "bfloat16", "--out", str(tmp_path / "f32")]) == 2
    assert capsys.readouterr().err == (
        f"posenc: error: {tmp_path / 'f32'} holds float32 cells (none__niah_single_1__64.json); "
        "a bfloat16 grid needs another --out\n"
    )
    monkeypatch.undo()
    monkeypatch.setattr(harness, "run_cell", cell)
    assert main([*argv, "--dtype", "bfloat16", "--out", str(tmp_path / "bf16")]) == 0 and seen[-1] == "bfloat16"
    assert "weights and compute in bfloat16." in (tmp_path / "bf16" / "table.md").read_text()


def test_score_cell_reads_rulers_per_length_scores():
    result = {
        "results": {"niah_single_1": {"alias": "x", "4096,none": 0.5, "4096_stderr,none": "N/A"}},
        "samples": {"niah_single_1": [{"4096": 1.0, "8192": -1.0}, {"4096": 0.0, "8192": -1.0}]},
    }
    assert harness.score_cell(result, "niah_single_1", 4096) == ("4096", [1.0, 0.0])


def test_what_lm_eval_prints_goes_to_stderr_not_the_tables_stdout(tmp_path, monkeypatch, capsys):
    """RULER's task module printed "Downloaded punkt_tab on rank 0" on stdout, where posenc harness prints its
    table."""
    import lm_eval

    def evaluate(**kwargs):
        print("Downloaded punkt_tab on rank 0")
        return {
            "results": {"niah_single_1": {"64,none": 0.5}},
            "samples": {"niah_single_1": [{"64": 1.0}, {"64": 0.0}]},
        }

    monkeypatch.setattr(lm_eval, "simple_evaluate", evaluate)
    cell = harness.run_cell(None, "niah_single_1", 64, 2, tmp_path / "cache", None)
    assert (cell["metric"], cell["score"], cell["n"]) == ("64", 0.5, 2)
    out = capsys.readouterr()
    assert out.out == "" and out.err == "Downloaded punkt_tab on rank 0\n"


def test_a_killed_evaluation_resumes_from_the_request_cache(llama_dir, tmp_path, monkeypatch):
    from lm_eval.api.model import CachingLM

    lm = harness.PosencLM(pretrained=str(llama_dir / "tiny"))
    good, long = _req("loglikelihood", passkey.FILLER, " pass"), _req("loglikelihood", passkey.FILLER * 20, " pass")
    (expected,) = lm.loglikelihood([good])
    with pytest.raises(PosencError, match="past what native RoPE reaches"):  # stopped at its second request
        CachingLM(lm, str(tmp_path / "cache.db")).loglikelihood([good, long])
    scored = []
    monkeypatch.setattr(lm, "_score", lambda context, continuation: scored.append(context) or (0.0, True))
    assert CachingLM(lm, str(tmp_path / "cache.db")).loglikelihood([good]) == [expected] and scored == []


def test_the_committed_ruler_cells_give_the_committed_table(tmp_path):
    """results/ruler-smollm2: the table is what write_table prints from the committed cells, each cell's interval
    the Wilson interval of its score and n."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "results" / "ruler-smollm2"
    cells = {}
    for path in sorted((root / "cells").glob("*.json")):
        c = json.loads(path.read_text())
        assert (c["low"], c["high"]) == pytest.approx(harness.wilson(c["score"] * c["n"], c["n"]))
        cells[c["adaptation"], c["task"], c["length"]] = c
    lengths = sorted({n for _, _, n in cells})
    text = harness.write_table(cells, ["niah_single_1"], lengths, ["none"], tmp_path)
    assert text == (root / "table.md").read_text() and "| none | 1.00 [0.84, 1.00] (n=20) |" in text
    assert (tmp_path / "table.csv").read_text() == (root / "table.csv").read_text()
