"""The benchmark suite: every registered scheme against RoPE, in one interleaved run.

    .venv/bin/python benchmarks/run.py            # all three sections (~15 min on 2 shared cores)
    .venv/bin/python benchmarks/run.py --sections attention --rounds 3

Writes ``benchmarks/results/suite.json`` (raw medians, ratios, machine, load
average) and ``suite.md`` (the tables). Sections, each per scheme in
``posenc.encodings.names()``:

- ``attention``: one attention layer of the default ``compare`` model (qkv
  projection, the scheme's hooks, the attention core, output projection),
  forward + backward in training mode at T = 1024, 2048, 4096, batch 1; ratio to
  RoPE (RoPE + SDPA). Goal: accumulated QK/QKV <= 1.15x.
- ``train``: training tokens/s of the default ``compare`` model (batch 16 x 128,
  AdamW step included); ratio to RoPE. Goal: >= 0.85x except PaTH on CPU.
- ``memory``: peak resident memory (VmHWM) of a fresh process that builds the
  default model and evaluates one 32768-token window with
  ``posenc.evaluate.evaluate_length``. Goal: <= 4 GiB.

Timings use ``torch.utils.benchmark.Timer`` (one thread, warm-up first); the
schemes are interleaved round by round so that the load of a shared machine
hits all of them alike, and each cell is the median over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from torch.utils.benchmark import Timer

from posenc import encodings
from posenc.compare import load_preset
from posenc.model import Attention, build_model
from posenc.train import make_optimizer

OUT = Path(__file__).resolve().parent / "results"
ATTN_LENGTHS = (1024, 2048, 4096)
MEM_LENGTH = 32768
GIB = 2**30


def default_model(scheme: str):
    return load_preset("default").model.model_copy(update={"encoding": scheme})


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# ---------------------------------------------------------------- attention


def attention_case(scheme: str, T: int) -> Timer:
    """Timer of one layer's forward + backward at length T (training mode: fresh random draws)."""
    cfg = default_model(scheme)
    torch.manual_seed(0)
    layer = Attention(cfg, 0).train()
    x = torch.randn(1, T, cfg.d_model, requires_grad=True)
    pos, tokens = torch.arange(T), torch.randint(0, cfg.vocab_size, (1, T))

    def step():
        layer(x, pos, tokens).sum().backward()

    return Timer("step()", globals={"step": step}, num_threads=1, label="attention", sub_label=scheme, description=str(T))


def bench_attention(schemes: list[str], rounds: int) -> dict:
    times = {s: {T: [] for T in ATTN_LENGTHS} for s in schemes}
    timers = {(s, T): attention_case(s, T) for s in schemes for T in ATTN_LENGTHS}
    for t in timers.values():  # warm-up
        t.timeit(1)
    for r in range(rounds):
        for T in ATTN_LENGTHS:
            for s in schemes:
                times[s][T].append(timers[s, T].timeit(1).median)
        print(f"attention round {r + 1}/{rounds} done, load {loadavg()}", file=sys.stderr)
    return {s: {T: float(np.median(v)) for T, v in row.items()} for s, row in times.items()}


# ---------------------------------------------------------------- training throughput


def train_case(scheme: str):
    """(Timer of one training step, tokens per step) for the default compare model."""
    preset = load_preset("default")
    cfg = default_model(scheme)
    torch.manual_seed(0)
    model = build_model(cfg).train()
    opt = make_optimizer(model, preset.train)
    B, T = preset.train.batch_size, cfg.train_length
    x, y = torch.randint(0, cfg.vocab_size, (2, B, T))

    def step():
        loss = model.token_nll(x, y).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), preset.train.grad_clip)
        opt.step()

    return Timer("step()", globals={"step": step}, num_threads=1, label="train", sub_label=scheme), B * T


def bench_train(schemes: list[str], rounds: int) -> dict:
    cases = {s: train_case(s) for s in schemes}
    times = {s: [] for s in schemes}
    for timer, _ in cases.values():
        timer.timeit(2)
    for r in range(rounds):
        for s in schemes:
            times[s].append(cases[s][0].timeit(2).median)
        print(f"train round {r + 1}/{rounds} done, load {loadavg()}", file=sys.stderr)
    return {s: cases[s][1] / float(np.median(times[s])) for s in schemes}


# ---------------------------------------------------------------- peak memory


def memory_child(scheme: str) -> None:
    """In a fresh process: evaluate one MEM_LENGTH window; print peak RSS and timing as JSON."""
    from posenc.evaluate import evaluate_length

    torch.set_num_threads(1)
    cfg = default_model(scheme)
    model = build_model(cfg)
    rng = np.random.default_rng(0)
    docs = [("synthetic", rng.integers(0, cfg.vocab_size, MEM_LENGTH + 1).astype(np.uint16))]
    base = _vm("VmRSS")
    t0 = time.time()
    rec = evaluate_length(model, docs, MEM_LENGTH, MEM_LENGTH, batch_tokens=8192, progress=False)
    print(json.dumps({"peak_bytes": _vm("VmHWM"), "before_eval_bytes": base, "seconds": time.time() - t0, "note": rec.get("note")}))


def _vm(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


def run_memory_child(scheme: str, timeout: float) -> dict:
    cmd = [sys.executable, __file__, "--memory-child", scheme]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:.0f} s"}
    if proc.returncode:
        return {"error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_memory(schemes: list[str], workers: int, timeout: float) -> dict:
    with ThreadPoolExecutor(workers) as pool:
        out = dict(zip(schemes, pool.map(lambda s: run_memory_child(s, timeout), schemes)))
    print(f"memory done, load {loadavg()}", file=sys.stderr)
    return out


# ---------------------------------------------------------------- report


def markdown(res: dict) -> str:
    m = res["machine"]
    lines = [
        "# Benchmark suite",
        "",
        f"`{res['command']}` on {m['cpu']} ({m['cores']} cores, shared), torch {m['torch']}, {res['date']}; "
        f"load average before {m['load_before']}, after {m['load_after']}. Medians over interleaved rounds; "
        "ratios are to RoPE measured in the same run.",
    ]
    if "attention" in res:
        a = res["attention"]
        lines += ["", "## Attention layer forward + backward (training mode), time ratio to RoPE + SDPA", "",
                  "Goal: accumulated QK/QKV <= 1.15x. RoPE's absolute times are in the first row.", "",
                  "| scheme | " + " | ".join(f"T={T}" for T in ATTN_LENGTHS) + " |", "|---|" + "---|" * len(ATTN_LENGTHS)]
        lines.append("| rope (ms) | " + " | ".join(f"{1e3 * a['rope'][str(T)]:.1f}" for T in ATTN_LENGTHS) + " |")
        for s, row in a.items():
            lines.append(f"| {s} | " + " | ".join(f"{row[str(T)] / a['rope'][str(T)]:.2f}x" for T in ATTN_LENGTHS) + " |")
    if "train" in res:
        t = res["train"]
        lines += ["", "## Training throughput of the default `compare` model (16 x 128 tokens per step, AdamW)", "",
                  "Goal: >= 0.85x RoPE for every scheme except PaTH on CPU.", "",
                  "| scheme | tokens/s | ratio to RoPE |", "|---|---|---|"]
        lines += [f"| {s} | {v:,.0f} | {v / t['rope']:.2f}x |" for s, v in t.items()]
    if "memory" in res:
        lines += ["", f"## Peak resident memory evaluating one {MEM_LENGTH}-token window (fresh process, VmHWM)", "",
                  "Goal: <= 4 GiB. `before eval` is the process after imports and model build.", "",
                  "| scheme | peak (GiB) | before eval (GiB) | eval time (s) | note |", "|---|---|---|---|---|"]
        for s, r in res["memory"].items():
            if "error" in r:
                lines.append(f"| {s} | failed | | | {r['error']} |")
            else:
                lines.append(f"| {s} | {r['peak_bytes'] / GIB:.2f} | {r['before_eval_bytes'] / GIB:.2f} | {r['seconds']:.0f} | {r['note'] or ''} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sections", nargs="+", default=["attention", "train", "memory"], choices=["attention", "train", "memory"])
    p.add_argument("--schemes", nargs="+", help="default: every registered scheme (posenc.encodings.names())")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (median over them)")
    p.add_argument("--memory-workers", type=int, default=2, help="memory subprocesses at a time")
    p.add_argument("--memory-timeout", type=float, default=1200, help="seconds per memory subprocess")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.memory_child:
        memory_child(args.memory_child)
        return 0
    schemes = args.schemes or encodings.names()
    schemes = ["rope"] + [s for s in schemes if s != "rope"]
    res = {
        "command": "python benchmarks/run.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "torch": torch.__version__, "load_before": loadavg()},
        "schemes": schemes,
    }
    t0 = time.time()
    if "attention" in args.sections:
        res["attention"] = {s: {str(T): v for T, v in row.items()} for s, row in bench_attention(schemes, args.rounds).items()}
    if "train" in args.sections:
        res["train"] = bench_train(schemes, args.rounds)
    if "memory" in args.sections:
        res["memory"] = bench_memory(schemes, args.memory_workers, args.memory_timeout)
    res["machine"]["load_after"] = loadavg()
    res["seconds"] = round(time.time() - t0)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "suite.json").write_text(json.dumps(res, indent=2) + "\n")
    (args.out / "suite.md").write_text(markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
