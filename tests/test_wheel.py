"""The built wheel: its metadata names every extra of pyproject.toml with its requirements, it holds every module,
preset and ``py.typed``, and installed on its own with its tracking and Slurm extras (a fresh virtualenv, offline)
it runs `posenc compare --preset quick` with TensorBoard tracking and the stamp, `--version`, `list --json` with the
parameters' meanings, `report`, a sweep of real submitit local jobs logged to W&B offline whose rerun has nothing
to do, and a training run stopped by Ctrl-C that the command it prints resumes to the end."""

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "src")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built offline (this environment's setuptools) from a copy of the sources: a build in the
    checkout would leave build/ there, whose stale files a later build would pack."""
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy
        copy(
            REPO / name,
            src / name,
            **({"ignore": shutil.ignore_patterns("__pycache__", "*.egg-info")} if copy is shutil.copytree else {}),
        )
    dist = src / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist), str(src)],
        check=True,
    )
    return next(dist.glob("posenc-*.whl"))


@pytest.fixture(scope="module")
def venv(tmp_path_factory, wheel) -> Path:
    """A fresh virtualenv with the wheel installed, its tensorboard, wandb and slurm extras included, without an
    index: every requirement must already be met by this environment's packages (torch, wandb, submitit, ...),
    which a path line appends after the venv's own site-packages (its editable posenc is not activated: a .pth
    path line does not run the .pth files there)."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site_packages(venv) / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "-q",
            "--no-index",
            f"{wheel}[tensorboard,wandb,slurm]",
        ],
        check=True,
    )
    return venv


def site_packages(venv: Path) -> Path:
    out = subprocess.run(
        [venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def installed(venv: Path, cwd: Path, **env: str):
    """``posenc(*argv)``: the venv's `posenc` run in ``cwd`` (one thread, nothing of this checkout on the path)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": "", **env}
    return lambda *argv: subprocess.run(
        [venv / "bin" / "posenc", *map(str, argv)], capture_output=True, text=True, cwd=cwd, env=env
    )


def test_wheel_metadata_names_every_extra_and_its_requirements(wheel):
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {"test", "pretrained", "hub", "cuda", "tensorboard", "wandb", "slurm"} <= set(declared)
    with zipfile.ZipFile(wheel) as z:
        meta = Parser().parsestr(z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode())
    assert sorted(meta.get_all("Provides-Extra")) == sorted(declared)
    listed = [Requirement(r) for r in meta.get_all("Requires-Dist")]
    for extra, reqs in declared.items():
        got = sorted(f"{r.name}{r.specifier}" for r in listed if r.marker and r.marker.evaluate({"extra": extra}))
        assert got == sorted(f"{r.name}{r.specifier}" for r in map(Requirement, reqs)), extra
    core = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert sorted(str(r) for r in listed if not r.marker) == sorted(str(Requirement(r)) for r in core)
    assert meta["Name"] == "posenc"
    assert wheel.name == "posenc-0.1.0-py3-none-any.whl"  # the file README's install section names


def test_wheel_holds_every_module_preset_and_py_typed(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        packed = {n for n in names if n.startswith("posenc/")}
        study = [n for n in names if n.startswith("experiments/") or "theory" in n]
        entry_points = next(z.read(n).decode() for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))
    shipped = {
        p.relative_to(REPO / "src").as_posix()
        for p in (REPO / "src" / "posenc").rglob("*")
        if p.is_file() and p.suffix in (".py", ".yaml", ".typed") and "__pycache__" not in p.parts
    }
    assert {
        "posenc/py.typed",
        "posenc/presets/quick.yaml",
        "posenc/presets/extend/quick.yaml",
        "posenc/presets/finetune/quick.yaml",
        "posenc/encodings/registry.py",
    } <= shipped
    assert packed == shipped
    assert study == [], study  # a study's code (experiments/: its claims, its theory checks) is not the library's
    assert "posenc = posenc.cli:run" in entry_points


@pytest.mark.slow
def test_installed_wheel_runs_compare_with_tracking_version_list_and_report(tmp_path, tiny_corpus, venv):
    where = subprocess.run(
        [
            venv / "bin" / "python",
            "-c",
            "import posenc, importlib.resources as r; print(posenc.__file__); "
            "print(r.files('posenc') / 'presets' / 'quick.yaml')",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": ""},
    ).stdout.split()
    assert all(p.startswith(str(site_packages(venv))) for p in where) and Path(where[1]).is_file()
    posenc = installed(venv, tmp_path)
    out = posenc(
        "compare",
        "--preset",
        "quick",
        "--schemes",
        "rope",
        "alibi",
        "--steps",
        "3",
        "--corpus",
        str(tiny_corpus),
        "--out",
        str(tmp_path / "runs"),
        "--log",
        "tensorboard",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report = (tmp_path / "runs" / "quick" / "report.md").read_text()
    assert "| rope | 1.000 |" in report and "| alibi | 1.000 |" in report
    assert any(
        (tmp_path / "runs" / "quick" / "rope" / "seed0").glob("events.out.tfevents.*")
    )  # tracking from the wheel
    stamp = json.loads((tmp_path / "runs" / "quick" / "invocations.jsonl").read_text().splitlines()[0])
    assert stamp["posenc"] == "0.1.0" and stamp["commit"] is None  # not a checkout
    job_stamp = json.loads((tmp_path / "runs" / "quick" / "rope" / "seed0" / "config.json").read_text())["stamp"]
    assert job_stamp["command"] == stamp["command"] and stamp["command"].startswith("posenc compare --preset quick ")
    assert posenc("--version").stdout.startswith("posenc 0.1.0 (commit n/a), torch ")
    listing = json.loads(posenc("list", "--json").stdout)  # parameter meanings come from the installed docstrings
    rope = next(s for s in listing["schemes"] if s["name"] == "rope")
    assert [(p["name"], p["default"]) for p in rope["params"]] == [
        ("rope_theta", 10000.0),
        ("pairing", "half"),
        ("rotary_fraction", 1.0),
        ("factor", 1.0),
    ]
    assert all(p["doc"] for p in rope["params"])
    out = posenc(
        "report", str(tmp_path / "runs" / "quick"), str(REPO / "results" / "default"), "--out", str(tmp_path / "side")
    )  # a committed run beside it
    assert out.returncode == 0, out.stderr[-2000:]
    assert (tmp_path / "side" / "report.md").is_file()


SWEEP = """name: sweep
model: {n_layer: 1, n_head: 2, d_model: 16, train_length: 16}
train: {steps: 4, batch_size: 2, ckpt_every: 2, log_every: 1, threads: 1, corpus: CORPUS}
eval: {multiples: [1, 2], max_tokens: 64, passkey: {trials: 0}, far_mass: {windows: 0}}
schemes: [rope, alibi]
"""


@pytest.mark.slow
def test_installed_wheel_sweeps_through_submitit_local_jobs_logged_to_wandb_offline(
    tmp_path, tiny_corpus, venv, wandb_records
):
    preset = tmp_path / "sweep.yaml"
    preset.write_text(SWEEP.replace("CORPUS", str(tiny_corpus)))
    posenc = installed(
        venv,
        tmp_path,
        WANDB_MODE="offline",
        **{f"WANDB_{d}_DIR": str(tmp_path / d.lower()) for d in ("CONFIG", "CACHE", "DATA")},
    )
    argv = ["compare", "--preset", preset, "--launcher", "local", "--log", "wandb", "--out", tmp_path / "runs"]
    out = posenc(*argv)
    assert out.returncode == 0, out.stderr[-2000:]
    run = tmp_path / "runs" / "sweep"
    records = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    ppl = {(r["scheme"], r["eval_length"]): r for r in records if r["kind"] == "ppl"}
    assert sorted(ppl) == [("alibi", 16), ("alibi", 32), ("rope", 16), ("rope", 32)] and all(
        1 < r["ppl"] < 300 for r in ppl.values()
    )
    report = (run / "report.md").read_text()
    for scheme in ("rope", "alibi"):
        at1, at2 = ppl[scheme, 16], ppl[scheme, 32]
        assert f"| {scheme} | {at1['ppl']:.2f} | {at2['ppl']:.2f} |" in report
        assert f"| {scheme} | 1.000 | {at2['ppl'] / at1['ppl']:.3f} |" in report
    logs = sorted(
        (run / "submitit").glob("*_0_log.out")
    )  # one submitit job per scheme, each finished in its own process
    assert len(logs) == 2 and all("Job completed successfully" in p.read_text() for p in logs)
    command = shlex.join(["posenc", *map(str, argv)])
    for scheme in ("rope", "alibi"):
        stamp = json.loads((run / scheme / "seed0" / "config.json").read_text())["stamp"]
        assert (
            stamp["commit"] is None and stamp["command"] == command
        )  # the wheel's code; the command, not submitit's entry point
        recs = wandb_records(run / scheme / "seed0")
        (meta,) = [r.run for r in recs if r.WhichOneof("record_type") == "run"]
        assert (meta.display_name, meta.run_group, meta.project) == (f"sweep/{scheme}/seed0", "sweep", "posenc")
        config = {u.key: json.loads(u.value_json) for u in meta.config.update}
        assert config["scheme"] == scheme and config["train"]["steps"] == 4 and config["stamp"]["posenc"] == "0.1.0"
        history = [
            {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            for r in recs
            if r.WhichOneof("record_type") == "history"
        ]
        logged = [json.loads(line) for line in (run / scheme / "seed0" / "train.jsonl").read_text().splitlines()]
        assert [(h["_step"], h["train/loss"]) for h in history if "train/loss" in h] == [
            (r["step"], pytest.approx(r["loss"])) for r in logged
        ]
        final = next(h for h in history if "eval/ppl@2x" in h)
        assert final["_step"] == 4 and final["eval/ppl@2x"] == pytest.approx(ppl[scheme, 32]["ppl"])
        assert [r.exit.exit_code for r in recs if r.WhichOneof("record_type") == "exit"] == [0]  # the run was finished

    again = posenc(*argv)
    assert again.returncode == 0 and f"posenc: all 2 jobs already done in {tmp_path / 'runs' / 'sweep'}" in again.stderr
    assert [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()] == records
    assert len(list((run / "submitit").glob("*_0_log.out"))) == 2  # nothing submitted


LONG = """name: long
model: {n_layer: 1, n_head: 2, d_model: 16, train_length: 16}
train: {steps: 200, batch_size: 2, ckpt_every: 50, log_every: 10, threads: 1, corpus: CORPUS}
schemes: [rope]
"""


@pytest.mark.slow
def test_installed_wheel_training_stopped_by_ctrl_c_resumes_to_the_end_with_the_command_it_prints(
    tmp_path, tiny_corpus, venv
):
    preset = tmp_path / "long.yaml"
    preset.write_text(LONG.replace("CORPUS", str(tiny_corpus)))
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    # SIGINT as the shell's default: a test run in the background inherits it ignored, and so would the command
    proc = subprocess.Popen(
        [venv / "bin" / "posenc", "train", "--scheme", "rope", "--preset", preset, "--out", out],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    err = []
    for line in proc.stderr:  # not a terminal: a progress line at each checkpoint
        err.append(line)
        if line.startswith("rope: step 50/200, "):
            proc.send_signal(signal.SIGINT)
            break
    err += proc.communicate(timeout=120)[1].splitlines(keepends=True)
    assert proc.returncode == 130, "".join(err)[-2000:]  # README: Ctrl-C exits with 130
    last = [line.rstrip("\n") for line in err[-2:]]
    stopped = re.fullmatch(rf"posenc: interrupted: {re.escape(str(out))} checkpointed at step (\d+) of 200", last[0])
    assert stopped and 50 <= int(stopped[1]) < 200, (
        last
    )  # the step in flight (if one was) finished, then the checkpoint
    assert last[1] == f"posenc: resume with: posenc train --scheme rope --preset {preset} --out {out} --resume"
    assert "posenc: stopping after this step" in "".join(err) and "\r" not in "".join(err)
    kept = (out / "train.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in kept] == list(range(10, int(stopped[1]) // 10 * 10 + 1, 10))

    argv = shlex.split(last[1].removeprefix("posenc: resume with: "))
    resumed = subprocess.run([venv / "bin" / argv[0], *argv[1:]], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert resumed.stdout.startswith("trained rope: step 200 of 200, ")
    log = (out / "train.jsonl").read_text().splitlines()
    assert log[: len(kept)] == kept  # resumed, not restarted: the interrupted run's records (and timings) are kept
    assert [json.loads(r)["step"] for r in log] == list(range(10, 201, 10))
    assert json.loads((out / "train_summary.json").read_text())["steps"] == 200
