"""What decides a run's numbers, recorded with it: versions, commit, device, dtype, threads, command line.

Learned schemes' results can change with the code, the CPU kernels and the thread count
(``benchmarks/run_noise.py`` measures the last), so a run that cannot be matched to them cannot be compared: each
training run's ``config.json``, each compare invocation's line of ``invocations.jsonl`` (beside ``preset.json``) and
the report header carry ``run_stamp()``.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Literal

import torch


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_commit() -> str | None:
    """The checkout's commit (with ``+dirty`` for uncommitted changes) when posenc runs from a git checkout, else
    None."""
    root = Path(__file__).resolve().parents[3]
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if head.returncode:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def cpu_name() -> str:
    """The CPU model (Linux: /proc/cpuinfo's model name; elsewhere platform.processor()) and the instruction set
    torch's CPU kernels dispatch to (``torch.backends.cpu.get_cpu_capability``: AVX2, AVX512 ...). Two machines
    with other kernels sum in another order, so learned schemes' weights can differ between them."""
    model = platform.processor() or platform.machine()
    info = Path("/proc/cpuinfo")
    if info.exists():
        model = next(
            (line.split(":", 1)[1].strip() for line in info.read_text().splitlines() if line.startswith("model name")),
            model,
        )
    return f"{model}, {torch.backends.cpu.get_cpu_capability()} kernels"


BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of CPU units with native bf16 dot products


def bf16_units(cpuinfo: Path = Path("/proc/cpuinfo")) -> list[str]:
    """The bfloat16 matrix units this machine has, detected, never assumed: on CUDA ``["cuda"]`` when
    ``torch.cuda.is_bf16_supported()``; on a Linux CPU its /proc/cpuinfo flags among ``amx_bf16`` (Intel AMX
    tiles) and ``avx512_bf16`` (AVX512 BF16 dot products, e.g. AMD Zen 4); empty elsewhere (bf16 matmuls would
    be emulated, slower than float32)."""
    if torch.cuda.is_available():
        return ["cuda"] if torch.cuda.is_bf16_supported() else []
    if not cpuinfo.exists():
        return []
    flags = next(
        (line.split(":", 1)[1].split() for line in cpuinfo.read_text().splitlines() if line.startswith("flags")), []
    )
    return [unit for unit in BF16_FLAGS if unit in flags]


def bf16_native(device: torch.device) -> bool:
    """Whether ``device`` has the bf16 matrix units :func:`bf16_units` finds (a CPU's on a CPU, a GPU's on CUDA):
    where "auto" picks bfloat16 (training's autocast, pretrained models' weights)."""
    units = bf16_units()
    return bool(units) and (device.type == "cuda") == (units == ["cuda"])


WeightsDtype = Literal["auto", "bfloat16", "float32"]


def resolve_dtype(dtype: WeightsDtype, device: torch.device | None = None) -> torch.dtype:
    """The dtype a pretrained model's weights and compute take: "auto" is bfloat16 where ``device`` (None: the CPU)
    has bf16 matrix units (:func:`bf16_native`), else float32; the others as named. Positions, angles and the
    softmax's log-probabilities stay float32 in every case."""
    if dtype == "auto":
        return torch.bfloat16 if bf16_native(device or torch.device("cpu")) else torch.float32
    return {"bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]


def run_stamp(
    precision: Literal["bf16", "fp32"] = "fp32", device: torch.device | None = None, weights: torch.dtype | None = None
) -> dict:
    """{posenc, commit, torch, transformers, python, platform, device, bf16_units, dtype, threads, command}: plain
    JSON values. command: the command line as a shell would retype it (arguments with spaces or quotes quoted).

    dtype: the weights' (torch's default) dtype and the compute dtype: ``precision`` "bf16" (bfloat16 autocast,
    float32 master weights; phases and cumulative sums stay float32+) or "fp32", as a training run resolved it
    (``posenc.train.precision.resolve_precision``). The default "fp32" is every other forward's (scoring, extend,
    finetune: none of them autocasts). ``weights``: a pretrained model's weights' dtype when it was cast
    (:func:`resolve_dtype`: bfloat16 weights compute in bfloat16); None: torch's default dtype. device: the one the
    run computes on (``posenc train --device``); None: the default (the first GPU when there is one, else the
    CPU)."""
    if device is None:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"cpu ({cpu_name()})" if device.type == "cpu" else str(device)
    units = bf16_units()
    return {
        "posenc": _version("posenc"),
        "commit": git_commit(),
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": name,
        "bf16_units": units,
        "dtype": _dtype_line(precision, weights),
        "threads": torch.get_num_threads(),
        "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }


def _dtype_line(precision: Literal["bf16", "fp32"], weights: torch.dtype | None) -> str:
    """The stamp's ``dtype``: "float32 weights, float32 compute", "float32 weights, bfloat16 autocast" or (a cast
    pretrained model) "bfloat16 weights, bfloat16 compute"."""
    name = str(weights or torch.get_default_dtype()).removeprefix("torch.")
    if weights is not None and weights != torch.float32:
        return f"{name} weights, {name} compute"
    return f"{name} weights, " + ("bfloat16 autocast" if precision == "bf16" else "float32 compute")


def stamp_line(stamp: dict) -> str:
    """The stamp as one line for a report header."""
    return (
        f"posenc {stamp['posenc']} (commit {stamp['commit'] or 'n/a'}), torch {stamp['torch']}, "
        f"transformers {stamp['transformers'] or 'not installed'}, "
        f"{stamp['device']}, {stamp.get('dtype', 'dtype n/a')}, {stamp['threads']} threads, "
        f"python {stamp['python']} on {stamp['platform']}; command: `{stamp['command']}`"
    )


UTC_FORMAT = "%Y-%m-%dT%H:%M:%SZ"  # invocations.jsonl's times: 2026-12-06T03:20:00Z


def utc_now() -> str:
    """The time now, UTC, to the second (``UTC_FORMAT``), as invocations.jsonl records it."""
    return datetime.datetime.now(datetime.timezone.utc).strftime(UTC_FORMAT)


def _duration(seconds: float) -> str:
    """Seconds as a person reads them: "97 min", or "42 s" under a minute (where minutes would round to 0)."""
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def wall_line(invocations: list[dict]) -> str:
    """A run's total wall time from its invocations.jsonl lines: each invocation's stamp with ``invocation`` (its id)
    and ``started``, and the line ``{"invocation", "finished"}`` it appends at its end (``posenc.jobs.launcher``):
    "97 min over 1 invocation (2026-12-06T00:00:00Z to ...)", in seconds under a minute. One stopped by Ctrl-C or
    SIGTERM ends with ``"interrupted": true`` and counts to its stop (said apart); invocations without an end (killed
    outright) or recorded before these fields are not counted and said apart ("at least" then: their time is
    unknown). Raises ValueError for a time not in ``UTC_FORMAT``."""
    ends = {s["invocation"]: s["finished"] for s in invocations if "finished" in s}
    starts = [s for s in invocations if "started" in s]
    timed = [(s["started"], ends[s["invocation"]]) for s in starts if s["invocation"] in ends]
    cut, old = len(starts) - len(timed), sum(1 for s in invocations if "started" not in s and "finished" not in s)
    stopped = sum(1 for s in invocations if s.get("interrupted"))
    parts = []
    if timed:
        seconds = sum(
            (datetime.datetime.strptime(b, UTC_FORMAT) - datetime.datetime.strptime(a, UTC_FORMAT)).total_seconds()
            for a, b in timed
        )
        parts.append(
            f"{'at least ' * bool(cut or old)}{_duration(seconds)} over {len(timed)} "
            f"invocation{'s' * (len(timed) > 1)} ({timed[0][0]} to {timed[-1][1]})"
        )
    if stopped:
        parts.append(f"{stopped} stopped by an interrupt (counted to its stop)")
    if cut:
        parts.append(f"{cut} killed before its end (not counted)")
    if old:
        parts.append(f"{old} recorded before the invocation times (not counted)")
    return "; ".join(parts) or "no invocation recorded"
