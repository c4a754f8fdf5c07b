"""compare through submitit: real jobs on submitit's LocalExecutor (CPU) train and evaluate, a failed job fails alone,
a rerun resumes and a rerun of other settings is refused as on the local pool; the Slurm flags reach sbatch."""

import functools
import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from posenc.cli.compare_cmd import cluster_config
from posenc.cli.main import build_parser, main
from posenc.config.plan import ClusterConfig, load_preset
from posenc.errors import PosencError
from posenc.jobs.compare import compare
from posenc.jobs.launcher import executor

submitit = pytest.importorskip("submitit")


def tiny_preset(corpus, schemes, steps=4):
    return load_preset(
        "quick",
        {
            "name": "sweep",
            "schemes": schemes,
            "model": {"n_layer": 1, "n_head": 2, "d_model": 16, "train_length": 16},
            "train": {"corpus": str(corpus), "steps": steps, "batch_size": 2, "ckpt_every": 2, "threads": 1},
            "eval": {"multiples": [1, 2], "max_tokens": 64, "passkey": {"trials": 0}, "far_mass": {"windows": 0}},
        },
    )


@pytest.mark.slow
def test_local_submitit_jobs_train_evaluate_and_resume(tiny_corpus, tmp_path, capsys):
    run = tmp_path / "runs" / "sweep"
    (run / "alibi").mkdir(parents=True)
    (run / "alibi" / "seed0").write_text("a file where the run directory goes")  # this job fails in its process
    report, failures = compare(
        tiny_preset(tiny_corpus, ["rope", "alibi"]),
        tmp_path / "runs",
        launcher="local",
        cluster=ClusterConfig(time_min=5),
    )
    records = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    assert sorted((r["scheme"], r["eval_length"]) for r in records if r["kind"] == "ppl") == [
        ("rope", 16),
        ("rope", 32),
    ]
    assert all(1 < r["ppl"] < 300 for r in records if r["kind"] == "ppl")
    assert json.loads((run / "rope" / "seed0" / "train_summary.json").read_text())["steps"] == 4
    assert list(failures) == ["alibi (seed 0)"] and "alibi" in failures["alibi (seed 0)"]
    assert "Traceback" in (run / "alibi" / "seed0.error.txt").read_text()
    assert any((run / "submitit").glob("*_log.out"))  # submitit's own job files
    assert "## Failed" in report.read_text()
    err = capsys.readouterr().err
    assert f"posenc: alibi (seed 0) failed: {failures['alibi (seed 0)']}" in err
    ids = {p.name.removesuffix("_0_log.err") for p in (run / "submitit").glob("*_0_log.err")}
    (line,) = [x for x in err.splitlines() if x.startswith("posenc: 2 submitit job(s) submitted (")]
    assert set(line.split(" submitted (")[1].split(")")[0].split(", ")) == ids and len(ids) == 2
    assert f"each job's output: {run / 'submitit'}/<job id>_0_log.err" in err  # where a job's progress lines go

    (run / "alibi" / "seed0").unlink()  # rerun: the finished job is skipped, the failed one runs; resources may change
    rerun = tiny_preset(tiny_corpus, ["rope", "alibi"]).model_copy(update={"cluster": ClusterConfig(time_min=6)})
    _, failures = compare(rerun, tmp_path / "runs", launcher="local")
    assert json.loads((run / "preset.json").read_text())["cluster"]["time_min"] == 6
    after = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    assert not failures and after[: len(records)] == records
    assert sorted(r["scheme"] for r in after[len(records) :] if r["kind"] == "ppl") == ["alibi", "alibi"]
    compare(tiny_preset(tiny_corpus, ["rope", "alibi"]), tmp_path / "runs", launcher="local")
    assert "posenc: all 2 jobs already done" in capsys.readouterr().err
    with pytest.raises(PosencError, match=r"holds results made with other settings \(train.steps 4 -> 6\)"):
        compare(tiny_preset(tiny_corpus, ["rope"], steps=6), tmp_path / "runs", launcher="local")


@pytest.mark.slow
def test_ctrl_c_of_local_submitit_jobs_ends_with_posencs_lines_only(tiny_corpus, tmp_path):
    runs = tmp_path / "runs"
    cmd = [
        sys.executable,
        "-m",
        "posenc.cli.main",
        "compare",
        "--preset",
        "quick",
        "--schemes",
        "rope",
        "alibi",
        "--steps",
        "100000",
        "--corpus",
        str(tiny_corpus),
        "--launcher",
        "local",
        "--out",
        str(runs),
    ]
    # its own process group, SIGINT as a shell's default: a terminal's Ctrl-C is SIGINT to every process of the group
    proc = subprocess.Popen(
        cmd,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert "submitit job(s) submitted" in proc.stderr.readline()
    logs = runs / "quick" / "submitit"
    while len(list(logs.glob("*_0_log.err"))) < 2:  # each controller has started its task, and waits for it
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)
    err = proc.communicate(timeout=120)[1]  # to the end: what every process holding posenc's stderr wrote
    assert proc.returncode == 130 and "Traceback" not in err, err
    last = json.loads((runs / "quick" / "invocations.jsonl").read_text().splitlines()[-1])
    assert last["interrupted"] is True and "finished" in last  # the stop's time counts in the run's wall time
    assert err.splitlines() == [
        f"posenc: interrupted: finished jobs are kept in {runs / 'quick'}; "
        "each interrupted one resumes from its last checkpoint",
        f"posenc: resume with: {shlex.join(['posenc', *cmd[3:]])}",
    ]
    deadline = time.time() + 60  # the controllers' tracebacks: in their own file (they may outlive posenc by a second)
    while (logs / "controllers.err").read_text().count("KeyboardInterrupt") < 2 and time.time() < deadline:
        time.sleep(0.2)
    assert (logs / "controllers.err").read_text().count("\nKeyboardInterrupt\n") >= 2


def test_slurm_flags_reach_the_sbatch_script(tmp_path, monkeypatch):
    import submitit.slurm.slurm as slurm

    monkeypatch.setattr(slurm.SlurmExecutor, "affinity", staticmethod(lambda: 2))  # as on a node where srun exists
    ex = executor(
        "slurm", tmp_path, ClusterConfig(partition="gpu", gpus_per_job=4, time_min=600, mem_gb=64), "posenc-paper"
    )
    text = ex._executor._make_submission_file_text("CMD", "uid")
    for line in (
        "--partition=gpu",
        "--gpus-per-node=4",
        "--time=600",
        "--mem=64GB",
        "--job-name=posenc-paper",
        "--nodes=1",
    ):
        assert f"#SBATCH {line}\n" in text


def test_slurm_where_there_is_none_is_one_line(tiny_corpus, tmp_path, capsys):
    code = main(
        [
            "compare",
            "--preset",
            "quick",
            "--schemes",
            "rope",
            "--steps",
            "2",
            "--corpus",
            str(tiny_corpus),
            "--out",
            str(tmp_path / "o"),
            "--launcher",
            "slurm",
            "--partition",
            "gpu",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        code == 2
        and len(err) == 1
        and err[0].startswith("posenc: error: --launcher slurm: submitit cannot use Slurm here")
    )
    assert main(["compare", "--preset", "quick", "--time-min", "5", "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == "posenc: error: --time-min: only with --launcher slurm (or local)\n"
    assert (
        main(["compare", "--preset", "quick", "--launcher", "local", "--time-min", "0", "--out", str(tmp_path / "o")])
        == 2
    )
    assert capsys.readouterr().err.startswith(
        "posenc: error: invalid cluster flags: time_min: Input should be greater than 0"
    )


def cluster_preset(tmp_path, cluster: str):
    path = tmp_path / "sweep.yaml"
    path.write_text(
        "name: sweep\nmodel: {n_layer: 1, n_head: 2, d_model: 16, train_length: 16}\ntrain: {steps: 2}\n"
        f"schemes: [rope]\ncluster: {cluster}\n"
    )
    return str(path)


def test_preset_cluster_settings_reach_the_submitit_jobs_and_flags_override_them(tmp_path):
    preset = load_preset(cluster_preset(tmp_path, "{partition: gpu, gpus_per_job: 0, time_min: 7, mem_gb: 32}"))
    assert preset.cluster == ClusterConfig(partition="gpu", gpus_per_job=0, time_min=7, mem_gb=32)
    args = lambda *flags: build_parser().parse_args(["compare", "--preset", "sweep.yaml", *flags])  # noqa: E731
    assert cluster_config(args("--launcher", "local"), preset) == preset.cluster
    assert cluster_config(args("--launcher", "local", "--time-min", "5", "--mem-gb", "64"), preset) == ClusterConfig(
        partition="gpu", gpus_per_job=0, time_min=5, mem_gb=64
    )
    assert cluster_config(args(), preset) is None  # the pool launcher ignores them
    timeout = functools.partial(os.getenv, "SUBMITIT_LOCAL_TIMEOUT_S")  # what submitit's local job is given, in seconds
    for flags, seconds in (((), "420"), (("--time-min", "5"), "300")):
        ex = executor("local", tmp_path / "submitit", cluster_config(args("--launcher", "local", *flags), preset))
        assert ex.submit(timeout).result() == seconds


def test_preset_cluster_settings_reach_the_sbatch_script_and_flags_override_them(tmp_path, monkeypatch):
    import submitit.slurm.slurm as slurm

    monkeypatch.setattr(slurm.SlurmExecutor, "affinity", staticmethod(lambda: 2))  # as on a node where srun exists
    preset = load_preset(cluster_preset(tmp_path, "{partition: gpu, gpus_per_job: 4, time_min: 1440, mem_gb: 128}"))
    args = build_parser().parse_args(
        ["compare", "--preset", "sweep.yaml", "--launcher", "slurm", "--partition", "long"]
    )
    text = executor("slurm", tmp_path, cluster_config(args, preset))._executor._make_submission_file_text("CMD", "uid")
    for line in ("--partition=long", "--gpus-per-node=4", "--time=1440", "--mem=128GB"):
        assert f"#SBATCH {line}\n" in text


def test_bad_preset_cluster_settings_are_one_line(tmp_path, capsys):
    assert main(["compare", "--preset", cluster_preset(tmp_path, "{time_min: 0}"), "--out", str(tmp_path / "o")]) == 2
    assert (
        capsys.readouterr().err
        == "posenc: error: invalid preset sweep.yaml: cluster.time_min: Input should be greater than 0\n"
    )
    assert main(["compare", "--preset", cluster_preset(tmp_path, "{nodes: 2}"), "--out", str(tmp_path / "o")]) == 2
    assert (
        capsys.readouterr().err
        == "posenc: error: invalid preset sweep.yaml: cluster.nodes: Extra inputs are not permitted\n"
    )


def _cleanup_fails_while_interrupted():
    try:
        raise KeyboardInterrupt
    finally:
        raise AttributeError("'NoneType' object has no attribute 'close'")  # cleanup broken by the interrupt


def test_an_error_raised_while_a_ctrl_c_unwinds_stops_the_job_and_writes_no_error_file(tmp_path):
    from posenc.jobs.launcher import finish_isolated, interrupted, start_isolated

    error_file = tmp_path / "seed0.error.txt"
    proc = start_isolated(_cleanup_fails_while_interrupted, (), error_file, [])
    with pytest.raises(KeyboardInterrupt):
        finish_isolated(proc, error_file)
    assert proc.exitcode == 130
    assert not error_file.exists()
    assert not interrupted(AttributeError("a plain failure"))


def _write_marker(path):
    path.write_text("ran")


def test_a_ctrl_c_while_a_job_starts_stops_it_at_its_entry_without_a_traceback(tmp_path, capfd):
    """A Ctrl-C while the spawned process bootstrapped printed KeyboardInterrupt tracebacks of Python's spawn code."""
    import multiprocessing
    import os
    import signal

    from posenc.jobs.launcher import finish_isolated, start_isolated

    stop, error_file, marker = multiprocessing.get_context("spawn").Event(), tmp_path / "e.txt", tmp_path / "ran"
    # Ctrl-C ours, as at a terminal: a suite started in the background (`pytest &`) inherits it ignored, and then
    # start_isolated rightly leaves its jobs' Ctrl-C alone
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = start_isolated(_write_marker, (marker,), error_file, [], stop=stop)
    finally:
        signal.signal(signal.SIGINT, previous)
    os.kill(proc.pid, signal.SIGINT)  # at once: the child is still starting Python
    stop.set()  # as run_pool does when the same Ctrl-C reaches it
    with pytest.raises(KeyboardInterrupt):
        finish_isolated(proc, error_file)
    assert proc.exitcode == 130 and not marker.exists() and not error_file.exists()
    assert "Traceback" not in capfd.readouterr().err
    calm = multiprocessing.get_context("spawn").Event()  # kept alive while the child unpickles it
    proc = start_isolated(_write_marker, (marker,), error_file, [], stop=calm)
    assert finish_isolated(proc, error_file) is None and marker.read_text() == "ran"  # not stopped: it runs
