"""Pretrained models in bfloat16 (``posenc.hf.loading.load(..., dtype)``, ``--dtype``, the harness's ``dtype=``):
weights and compute in bf16, the rotary frequencies float32 (equal to the float32 model's), every schedule, method
and scheme within bf16's rounding of the float32 log-probabilities, a key and a run tag of their own."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from test_generation import L0, llama  # noqa: E402  (the tiny random Llama, native context L0 = 16)

from posenc import rope  # noqa: E402
from posenc.cli.main import main  # noqa: E402
from posenc.encodings.base import keeping_precision  # noqa: E402
from posenc.errors import PosencError  # noqa: E402
from posenc.hf import loading  # noqa: E402
from posenc.hf.adaptation import Adaptation  # noqa: E402
from posenc.hf.schedules import Extension  # noqa: E402
from posenc.store import stamp  # noqa: E402

IDS = torch.randint(0, 128, (1, 3 * L0), generator=torch.Generator().manual_seed(0))
BF16_TOL = 0.02  # nats: bf16's 8-bit mantissa on this model's log-probabilities (measured 3-4e-3)


def adapted(dtype: torch.dtype) -> Adaptation:
    """The tiny Llama cast as ``posenc.hf.loading.load`` casts it."""
    model = llama()
    if dtype != torch.float32:
        model.model.rotary_emb = keeping_precision(type(model.model.rotary_emb))(config=model.config)
        model.to(dtype)
    return Adaptation(model)


def logprobs(a: Adaptation) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(a.model(IDS).logits.float(), -1)


@pytest.mark.parametrize("units,want", [([], torch.float32), (["avx512_bf16"], torch.bfloat16)])
def test_auto_is_bf16_where_the_cpu_has_bf16_units(monkeypatch, units, want):
    monkeypatch.setattr(stamp, "bf16_units", lambda: units)
    assert stamp.resolve_dtype("auto") == want
    assert stamp.resolve_dtype("float32") == torch.float32 and stamp.resolve_dtype("bfloat16") == torch.bfloat16


def test_the_stamp_names_cast_weights():
    assert stamp.run_stamp(weights=torch.bfloat16)["dtype"] == "bfloat16 weights, bfloat16 compute"
    assert stamp.run_stamp(weights=torch.float32)["dtype"] == "float32 weights, float32 compute"
    assert stamp.run_stamp()["dtype"] == "float32 weights, float32 compute"


def test_a_bf16_load_keeps_float32_frequencies(llama_dir):
    fp32 = loading.load(str(llama_dir / "tiny"))
    bf16 = loading.load(str(llama_dir / "tiny"), "bfloat16")
    assert bf16.dtype == torch.bfloat16 and fp32.dtype == torch.float32
    assert {p.dtype for p in bf16.model.parameters()} == {torch.bfloat16}
    got, want = bf16.model.model.rotary_emb.inv_freq, fp32.model.model.rotary_emb.inv_freq
    assert got.dtype == torch.float32 and torch.equal(got, want)
    ids = torch.arange(1, 40)[None]
    with torch.no_grad():
        a, b = (torch.log_softmax(m.model(ids).logits.float(), -1) for m in (fp32, bf16))
    assert 0 < (a - b).abs().max() < BF16_TOL


@pytest.mark.parametrize("schedule", rope.NAMES)
def test_every_schedule_in_bf16_is_float32_within_rounding(schedule):
    ext = Extension(schedule, factor=4.0, window=4 if "rerope" in schedule else None)
    out = []
    for dtype in (torch.float32, torch.bfloat16):
        a = adapted(dtype)
        a.set_schedule(ext)
        out.append(logprobs(a))
        if schedule not in rope.RELATIVE:
            assert a.model.model.rotary_emb.inv_freq.dtype == torch.float32
    assert 0 < (out[0] - out[1]).abs().max() < BF16_TOL


@pytest.mark.parametrize(
    "spec", ["self-extend:group=2,window=4", "lm-infinite", "dual-chunk", "sinks:n_sink=4,window=8"]
)
def test_every_method_in_bf16_is_float32_within_rounding(spec):
    out = []
    for dtype in (torch.float32, torch.bfloat16):
        a = adapted(dtype)
        a.set_method(spec)
        out.append(logprobs(a))
    assert 0 < (out[0] - out[1]).abs().max() < BF16_TOL


@pytest.mark.parametrize("spec", ["alibi", "acc-rand-qk", "forget", "path"])
def test_a_scheme_in_a_bf16_model_takes_its_dtype(spec):
    out = []
    for dtype in (torch.float32, torch.bfloat16):
        a = adapted(dtype)
        a.set_scheme(spec)
        learned = {p.dtype for n, p in a.model.named_parameters() if ".posenc." in n}
        assert learned <= {dtype}
        out.append(logprobs(a))
    assert 0 < (out[0] - out[1]).abs().max() < BF16_TOL


def test_the_key_tells_the_dtypes_apart_and_keeps_float32s():
    fp32, bf16 = adapted(torch.float32), adapted(torch.bfloat16)
    assert fp32.key(32) != bf16.key(32)
    assert fp32.key(32) == Adaptation(llama()).key(32)


def test_extend_in_bf16_records_its_dtype_and_a_tag_of_its_own(llama_dir):
    base = ["extend", "--model", str(llama_dir / "tiny"), "--corpus", str(llama_dir / "corpus.txt")]
    base += ["--schedules", "none", "--lengths", "16", "--passkey-lengths"]
    assert main([*base, "--out", str(llama_dir / "fp32")]) == 0
    assert main([*base, "--out", str(llama_dir / "bf16"), "--dtype", "bfloat16"]) == 0
    cfg32, cfg16 = (json.loads((llama_dir / d / "config.json").read_text()) for d in ("fp32", "bf16"))
    assert "dtype" not in cfg32 and cfg16["dtype"] == "bfloat16"
    assert cfg16["invocations"][-1]["stamp"]["dtype"] == "bfloat16 weights, bfloat16 compute"
    recs = {
        d: [json.loads(x) for x in (llama_dir / d / "records.jsonl").read_text().splitlines()] for d in ("fp32", "bf16")
    }
    nll = {d: [r["nll_sum"] for r in recs[d] if r["kind"] == "ppl"] for d in recs}
    assert len(nll["fp32"]) == len(nll["bf16"]) > 0 and nll["fp32"] != nll["bf16"]
    assert {r["setting"] for r in recs["fp32"]}.isdisjoint({r["setting"] for r in recs["bf16"]})


def test_dtype_is_for_pretrained_models_only(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model": {}, "train": {}}))  # a posenc train run's shape
    assert main(["generate", str(tmp_path), "--prompt", "ab", "--dtype", "bfloat16"]) == 2
    assert capsys.readouterr().err.strip().endswith("is a train run, which generates in float32")


def test_the_harness_takes_a_dtype_and_refuses_another():
    pytest.importorskip("lm_eval")
    from posenc.jobs.harness import parse_model_args

    assert parse_model_args({"pretrained": "smollm2", "dtype": "bfloat16"}).dtype == "bfloat16"
    assert parse_model_args({"pretrained": "smollm2"}).dtype == "float32"
    with pytest.raises(PosencError, match="dtype must be one of auto, bfloat16, float32"):
        parse_model_args({"pretrained": "smollm2", "dtype": "float16"})
