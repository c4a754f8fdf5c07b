"""The benchmark scripts keep running: the GPU check's CPU smoke mode and a one-round suite.

No timing is asserted here (speed targets live in benchmarks/results); these catch a script
that no longer runs against the current package, which CI would otherwise never notice.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from posenc import encodings
from posenc.config.plan import load_preset

ROOT = Path(__file__).resolve().parents[1]


def run_script(args, out_env=None, timeout=600):
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(out_env or {})}
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


@pytest.mark.slow
def test_gpu_check_smoke_run_on_cpu(tmp_path):
    run_script(["benchmarks/gpu_check.py", "--device", "cpu", "--tiny", "--steps", "1"], {"OUT": str(tmp_path)})
    res = json.loads((tmp_path / "gpu_check.json").read_text())
    assert list(res["agreement"]) == ["rope"] + [s for s in encodings.names() if s != "rope"]
    for scheme, r in res["agreement"].items():
        assert "error" not in r, (scheme, r)
        # CPU against CPU with the same weights and inputs: the comparison must find no difference at all
        assert r["layer"]["ok"] and r["layer"]["out"] == 0 and r["layer"]["grad_x"] == 0, (scheme, r)
        assert r["model"]["ok"] and r["model"]["rel_f32"] == 0, (scheme, r)
    default = load_preset("default").schemes
    tps, compiled = res["throughput"]["tokens_per_s"], res["throughput"]["compiled"]
    assert list(tps) == default and all(isinstance(v, float) and v > 0 for v in tps.values()), tps
    assert list(compiled) == default[:1] and compiled[default[0]] > 0, compiled
    assert list(res["memory"]) == default and all(m["finite"] and m["seconds"] > 0 for m in res["memory"].values()), (
        res["memory"]
    )
    assert all(
        set(r) == {"alibi flex", "alibi chunked", "forget flex", "forget chunked"} for r in res["flex"].values()
    ), res["flex"]
    assert "| acc-rand-qkv |" in (tmp_path / "gpu_check.md").read_text()


@pytest.mark.slow
def test_suite_one_round_writes_ratio_tables(tmp_path):
    run_script(
        [
            "benchmarks/run.py",
            "--sections",
            "attention",
            "train",
            "--schemes",
            "acc-rand-qk",
            "--rounds",
            "1",
            "--out",
            str(tmp_path),
        ]
    )
    res = json.loads((tmp_path / "suite.json").read_text())["sections"]
    attn, train = res["attention"]["rows"], res["train"]["rows"]
    assert set(attn) == set(train) == {"rope", "acc-rand-qk"}
    for T in ("1024", "2048", "4096"):  # one round: the ratio is the two cells' times divided
        assert attn["rope"][T]["ratio"] == 1.0
        assert attn["acc-rand-qk"][T]["ratio"] == pytest.approx(
            attn["acc-rand-qk"][T]["seconds"] / attn["rope"][T]["seconds"], rel=1e-9
        )
    assert train["rope"]["ratio"] == 1.0 and train["acc-rand-qk"]["tokens_per_s"] > 0
    md = (tmp_path / "suite.md").read_text()
    assert "| acc-rand-qk |" in md and "Training throughput" in md


def test_run_noise_between_two_committed_runs(tmp_path):
    """``run_noise.py --between`` reads committed results (typed records from results.csv) and gives each scheme's
    largest change over every length: the two machines of results/demo-epyc and results/demo-xeon (make demo at one
    commit's initial weights)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("run_noise", ROOT / "benchmarks" / "run_noise.py")
    rn = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rn)
    rn.RESULTS = tmp_path
    rn.between(ROOT / "results" / "demo-epyc", ROOT / "results" / "demo-xeon")
    worst = json.loads((tmp_path / "run_noise_machines.json").read_text())["largest_by_scheme"]
    assert worst["acc-learned-qkv"]["ratio"] == pytest.approx(0.0364, abs=5e-4)
    assert max(worst["alibi"].values()) < 1e-4 and max(worst["rope+forget"].values()) < 3e-3  # the others barely move
    assert (
        "| acc-learned-qkv | 128x | 9.9347 | 10.2122 | 2.79% | 1.3298 | 1.3714 | 3.13% |"
        in (tmp_path / "run_noise_machines.md").read_text()
    )


@pytest.mark.slow
def test_speed_benchmark_smoke_run_writes_every_section(tmp_path):
    run_script(
        [
            "benchmarks/speed.py",
            "--schemes",
            "rope",
            "alibi",
            "--rounds",
            "1",
            "--lengths",
            "256",
            "--contexts",
            "128",
            "--no-compile",
            "--out",
            str(tmp_path),
        ]
    )
    res = json.loads((tmp_path / "speed.json").read_text())
    sec = res["sections"]
    assert set(sec) == {"peak", "train", "prefill", "generate"}
    assert all(v > 0 for v in sec["peak"].values()) and len(sec["peak"]) == 6
    assert set(sec["train"]["alibi"]) == {"fp32", "bf16"} and all(
        c["tokens_per_s"] > 0 for c in sec["train"]["alibi"].values()
    )
    assert sec["prefill"]["rope"]["256"]["ratio"] == 1.0 and sec["prefill"]["alibi"]["256"]["seconds"] > 0
    assert set(sec["generate"]) == {"rope", "alibi", "hf-llama"}
    assert "| alibi |" in (tmp_path / "speed.md").read_text()
