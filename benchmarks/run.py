"""The benchmark suite: every registered scheme against RoPE, in one interleaved run.

    .venv/bin/python benchmarks/run.py            # all three sections (~50 min on 2 cores)
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
- ``compile``: training tokens/s of the same model eager and under
  ``torch.compile`` (``train.compile``), timed alternately; speedup.
- ``memory``: peak resident memory (VmHWM) of a fresh process that builds the
  default ``compare`` model (all its layers; ``--memory-layers`` overrides) and
  evaluates one 32768-token window with ``posenc.eval.perplexity.evaluate_length``,
  one thread per process. Goal: <= 4 GiB.

Timings use ``torch.utils.benchmark.Timer`` (one thread, warm-up first); the
schemes are interleaved round by round so that the load of a shared machine
hits all of them alike, and each cell is the median over rounds.
"""

from __future__ import annotations

import argparse
import dataclasses
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
from posenc.config.plan import load_preset
from posenc.errors import one_line
from posenc.model import Attention, build_model
from posenc.reports.render import markdown_table
from posenc.store.checkpoint import atomic_write_bytes
from posenc.train.optimizer import make_optimizer
from posenc.train.precision import autocast

OUT = Path(__file__).resolve().parent / "results"
ATTN_LENGTHS = (1024, 2048, 4096)
MEM_LENGTH = 32768
GIB = 2**30


def default_model(scheme: str):
    return dataclasses.replace(load_preset("default").model, encoding=scheme)


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# ---------------------------------------------------------------- attention


def attention_case(scheme: str, T: int) -> Timer:
    """Timer of one layer's forward + backward at length T (training mode: fresh random draws)."""
    cfg = default_model(scheme)
    torch.manual_seed(0)
    layer = Attention.from_config(cfg, 0).train()
    x = torch.randn(1, T, cfg.d_model, requires_grad=True)
    pos, tokens = torch.arange(T), torch.randint(0, cfg.vocab_size, (1, T))

    def step():
        layer(x, pos, tokens=tokens).sum().backward()

    return Timer(
        "step()", globals={"step": step}, num_threads=1, label="attention", sub_label=scheme, description=str(T)
    )


def _warm(make, *args):
    """(case, None) after one warm-up run, or (None, error line) when the scheme cannot run."""
    try:
        case = make(*args)
        case.timeit(1)
        return case, None
    except Exception as exc:  # reported in the table; the other schemes go on
        return None, one_line(exc)


def paired(timers: dict, rounds: int, number: int, section: str) -> dict:
    """Median time and median paired ratio to RoPE per case.

    ``timers``: (scheme, key) -> Timer, with a ("rope", key) entry for every key.
    Each round times every case right after RoPE at the same key, so load that
    changes over the run cancels in the ratio.
    """
    times = {c: [] for c in timers}
    ratios = {c: [] for c in timers}
    for r in range(rounds):
        for (s, key), timer in timers.items():
            if s == "rope":
                continue
            ref = timers["rope", key].timeit(number).median
            t = timer.timeit(number).median
            times["rope", key].append(ref)
            times[s, key].append(t)
            ratios[s, key].append(t / ref)
        print(f"{section} round {r + 1}/{rounds} done, load {loadavg()}", file=sys.stderr)
    return {
        c: {"seconds": float(np.median(times[c])), "ratio": float(np.median(ratios[c])) if ratios[c] else 1.0}
        for c in timers
    }


def bench_attention(schemes: list[str], rounds: int) -> dict:
    timers, rows = {}, {}
    for s in schemes:
        for T in ATTN_LENGTHS:
            timer, err = _warm(attention_case, s, T)
            if err:
                rows[s] = {"error": err}
                break
            timers[s, T] = timer
    for (s, T), cell in paired({c: t for c, t in timers.items() if c[0] not in rows}, rounds, 1, "attention").items():
        rows.setdefault(s, {})[str(T)] = cell
    return rows


# ---------------------------------------------------------------- training throughput


TRAIN_TOKENS = 16 * 128  # the default preset's batch (checked in train_case)


def train_case(scheme: str, compiled: bool = False, precision: str = "fp32") -> Timer:
    """Timer of one training step of the default compare model (batch 16 x 128, AdamW), eager or under torch.compile,
    in fp32 or under bf16 autocast (``posenc.train.precision.autocast``, as ``train.precision``)."""
    preset = load_preset("default")
    cfg = default_model(scheme)
    torch.manual_seed(0)
    model = build_model(cfg).train()
    opt = make_optimizer(model, preset.train)
    B, T = preset.train.batch_size, cfg.train_length
    assert B * T == TRAIN_TOKENS, "update TRAIN_TOKENS to the default preset's batch"
    x, y = torch.randint(0, cfg.vocab_size, (2, B, T))
    nll = torch.compile(model.token_nll) if compiled else model.token_nll

    def step():
        with autocast(precision, x.device):
            loss = nll(x, y).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), preset.train.grad_clip)
        opt.step()

    return Timer("step()", globals={"step": step}, num_threads=1, label="train", sub_label=scheme)


def bench_train(schemes: list[str], rounds: int) -> dict:
    timers, rows = {}, {}
    for s in schemes:
        timer, err = _warm(train_case, s)
        if err:
            rows[s] = {"error": err}
        else:
            timers[s, "step"] = timer
    for (s, _), cell in paired(timers, rounds, 2, "train").items():
        rows[s] = {"tokens_per_s": TRAIN_TOKENS / cell["seconds"], "ratio": 1 / cell["ratio"]}
    return rows


def bench_compile(schemes: list[str], rounds: int) -> dict:
    """Eager against compiled training steps per scheme, timed alternately; median over rounds."""
    rows, timers = {}, {}
    for s in schemes:
        for mode in ("eager", "compiled"):
            timer, err = _warm(train_case, s, mode == "compiled")
            if err:
                rows[s] = {"error": err}
                break
            timers[s, mode] = timer
    times = {c: [] for c in timers}
    for r in range(rounds):
        for c, timer in timers.items():
            times[c].append(timer.timeit(2).median)
        print(f"compile round {r + 1}/{rounds} done, load {loadavg()}", file=sys.stderr)
    for s in dict.fromkeys(s for s, _ in timers):  # in the order given
        eager, comp = (float(np.median(times[s, m])) for m in ("eager", "compiled"))
        rows[s] = {
            "eager_tokens_per_s": TRAIN_TOKENS / eager,
            "compiled_tokens_per_s": TRAIN_TOKENS / comp,
            "speedup": eager / comp,
        }
    return rows


# ---------------------------------------------------------------- peak memory


def memory_child(scheme: str, layers: int) -> None:
    """In a fresh process: evaluate one MEM_LENGTH window; print peak RSS and timing as JSON."""
    from posenc.eval.perplexity import evaluate_length

    torch.set_num_threads(1)
    cfg = dataclasses.replace(default_model(scheme), n_layer=layers)
    model = build_model(cfg)
    rng = np.random.default_rng(0)
    docs = [("synthetic", rng.integers(0, cfg.vocab_size, MEM_LENGTH + 1).astype(np.uint16))]
    base = _vm("VmRSS")
    t0 = time.time()
    rec = evaluate_length(
        model, docs, MEM_LENGTH, {"scheme": cfg.encoding}, MEM_LENGTH, batch_tokens=8192, progress=False
    )
    print(
        json.dumps(
            {"peak_bytes": _vm("VmHWM"), "before_eval_bytes": base, "seconds": time.time() - t0, "note": rec.note}
        )
    )


def _vm(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


def run_memory_child(scheme: str, layers: int, timeout: float) -> dict:
    cmd = [sys.executable, __file__, "--memory-child", scheme, "--memory-layers", str(layers)]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"}
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:.0f} s"}
    if proc.returncode:
        return {"error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_memory(schemes: list[str], layers: int, workers: int, timeout: float) -> dict:
    with ThreadPoolExecutor(workers) as pool:
        out = dict(zip(schemes, pool.map(lambda s: run_memory_child(s, layers, timeout), schemes)))
    print(f"memory done, load {loadavg()}", file=sys.stderr)
    return out


# ---------------------------------------------------------------- report


TITLES = {
    "attention": "Attention layer forward + backward (training mode), time ratio to RoPE + SDPA",
    "train": "Training throughput of the default `compare` model (16 x 128 tokens per step, AdamW)",
    "memory": f"Peak resident memory evaluating one {MEM_LENGTH}-token window (fresh process, VmHWM)",
    "compile": "Training throughput eager vs torch.compile (default model, 16 x 128 tokens per step, AdamW, CPU)",
}


def section_markdown(name: str, sec: dict) -> list[str]:
    rows = sec["rows"]
    head = [
        "",
        f"## {TITLES[name]}",
        "",
        f"`{sec['command']}`, {sec['date']}, {sec['seconds']} s; load average before "
        f"{sec['load_before']}, after {sec['load_after']}.",
    ]
    if sec.get("earlier"):
        head += [
            "",
            "Rows of other schemes kept from earlier runs: " + "; ".join(f"`{c}`" for c in sec["earlier"]) + ".",
        ]
    if name == "attention":
        head += [
            "Each cell: median over rounds of the time ratio to RoPE timed just before it (batch 1; the goal for "
            "accumulated QK/QKV is <= 1.15x). First row: RoPE's median time.",
            "",
        ]
        cells = [["rope (ms)", *(f"{1e3 * rows['rope'][str(T)]['seconds']:.1f}" for T in ATTN_LENGTHS)]]
        cells += [
            [s, f"failed: {row['error']}"]
            if "error" in row
            else [s, *(f"{row[str(T)]['ratio']:.2f}x" for T in ATTN_LENGTHS)]
            for s, row in rows.items()
        ]
        head.append(markdown_table(["scheme", *(f"T={T}" for T in ATTN_LENGTHS)], cells))
    elif name == "train":
        cells = [
            [s, f"failed: {r['error']}", ""] if "error" in r else [s, f"{r['tokens_per_s']:,.0f}", f"{r['ratio']:.2f}x"]
            for s, r in rows.items()
        ]
        head += [
            "Ratio: median over rounds of the step-time ratio, inverted (goal >= 0.85x except PaTH on CPU).",
            "",
            markdown_table(["scheme", "tokens/s", "ratio to RoPE"], cells),
        ]
    elif name == "compile":
        cells = [
            [s, f"failed: {r['error']}", "", ""]
            if "error" in r
            else [s, f"{r['eager_tokens_per_s']:,.0f}", f"{r['compiled_tokens_per_s']:,.0f}", f"{r['speedup']:.2f}x"]
            for s, r in rows.items()
        ]
        head += [
            "One thread; eager and compiled steps timed alternately, median over rounds (compilation excluded).",
            "",
            markdown_table(["scheme", "eager tokens/s", "compiled tokens/s", "speedup"], cells),
        ]
    else:
        head += [
            f"Goal: <= 4 GiB. The default `compare` model with {sec['layers']} layer(s), one thread per process. "
            "`before eval`: the process after imports and model build.",
            "",
        ]
        cells = [
            [s, "failed", "", "", r["error"]]
            if "error" in r
            else [
                s,
                f"{r['peak_bytes'] / GIB:.2f}",
                f"{r['before_eval_bytes'] / GIB:.2f}",
                f"{r['seconds']:.0f}",
                r["note"] or "",
            ]
            for s, r in rows.items()
        ]
        head.append(markdown_table(["scheme", "peak (GiB)", "before eval (GiB)", "eval time (s)", "note"], cells))
    return head


def markdown(res: dict) -> str:
    m = res["machine"]
    lines = [
        "# Benchmark suite",
        "",
        f"{m['cpu']}, {m['cores']} cores, torch {m['torch']}. "
        "Every scheme registered at the time of the run; ratios are to RoPE within one interleaved run per section.",
    ]
    for name in TITLES:
        if name in res["sections"]:
            lines += section_markdown(name, res["sections"][name])
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sections", nargs="+", default=list(TITLES), choices=list(TITLES))
    p.add_argument("--schemes", nargs="+", help="default: every registered scheme (posenc.encodings.names())")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (median over them)")
    p.add_argument(
        "--memory-layers", type=int, help="layers of the model in the memory section (default: the default model's)"
    )
    p.add_argument("--memory-workers", type=int, default=2, help="memory subprocesses at a time")
    p.add_argument("--memory-timeout", type=float, default=3600, help="seconds per memory subprocess")
    p.add_argument(
        "--out", type=Path, default=OUT, help="results folder; sections not run are kept from its suite.json"
    )
    p.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.memory_layers = args.memory_layers or load_preset("default").model.n_layer
    if args.memory_child:
        memory_child(args.memory_child, args.memory_layers)
        return 0
    schemes = args.schemes or encodings.names()
    schemes = ["rope"] + [s for s in schemes if s != "rope"]
    path = args.out / "suite.json"
    res = json.loads(path.read_text()) if path.exists() else {"sections": {}}
    res["machine"] = {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
    }
    run = {
        "attention": lambda: bench_attention(schemes, args.rounds),
        "train": lambda: bench_train(schemes, args.rounds),
        "memory": lambda: bench_memory(schemes, args.memory_layers, args.memory_workers, args.memory_timeout),
        "compile": lambda: bench_compile(schemes, args.rounds),
    }
    for name in args.sections:
        sec = {
            "command": "python benchmarks/run.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load_before": loadavg(),
            "rounds": args.rounds,
        }
        if name == "memory":
            sec["layers"] = args.memory_layers
        t0 = time.time()
        sec["rows"] = run[name]()
        sec.update(load_after=loadavg(), seconds=round(time.time() - t0))
        old = res["sections"].get(name, {})
        kept = {s: r for s, r in old.get("rows", {}).items() if s not in sec["rows"]}
        if kept:  # rows of schemes not run now stay, with the command that measured them
            sec["rows"] = {**sec["rows"], **kept}
            sec["earlier"] = (
                sorted({*old.get("earlier", []), f"{old['command']} ({old['date']})"})
                if "command" in old
                else old.get("earlier", [])
            )
        res["sections"][name] = sec
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, (json.dumps(res, indent=2) + "\n").encode())
    atomic_write_bytes(args.out / "suite.md", markdown(res).encode())
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
