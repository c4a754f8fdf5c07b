"""Prefill time of the training-free long-context methods' attention (posenc.methods), explicit and fast paths.

    .venv/bin/python benchmarks/method_prefill.py                        # 4K and 16K, 3 repeats, 1 thread
    .venv/bin/python benchmarks/method_prefill.py --lengths 4096 --repeats 1
    .venv/bin/python benchmarks/method_prefill.py --dtype bfloat16       # results/method_prefill_bfloat16.*

Attention alone: one sequence, 4 heads x 64 head dim, float32 (or ``--dtype bfloat16``: q, k, v in bf16, the angles
float32, as a bf16 model's attention), RoPE (theta 10000), random q, k, v, under
``torch.no_grad()`` on one thread, timed as the process's CPU time (a shared machine's other processes stretch
wall time much more). Cases: plain causal SDPA of the RoPE-rotated q and k (the rotation inside the timing, as the
methods' own rotations are), and per method the explicit path (``posenc.methods.method_attention(fast=False)``: the
reference path, which ``method_attention`` takes with grad enabled) and the fast path (``method_attention`` under
no grad, block 512). The cases are interleaved within each repeat and each cell is the minimum over the repeats;
the largest difference between the two paths' outputs is written beside them. Writes
``results/method_prefill.{json,md}`` (bfloat16: ``method_prefill_bfloat16.{json,md}``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from posenc.methods import fast_applies, method_attention, parse
from posenc.reports.render import markdown_table
from posenc.rope import rope_inv_freq
from posenc.rope.rerope import _rot
from posenc.store.checkpoint import atomic_write_bytes

OUT = Path(__file__).resolve().parent / "results"
METHODS = {
    "self-extend": "self-extend:group=4,window=1024",
    "lm-infinite": "lm-infinite:n_global=10,window=4096",
    "sinks": "sinks:n_sink=4,window=4092",
    "dual-chunk": "dual-chunk:chunk=3072,local=256",
}
HEADS, HEAD_DIM = 4, 64


def inputs(T: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    """q, k, v (1, 4, T, 64) in ``dtype`` and the positions 0..T-1, the same for every case at one length."""
    g = torch.Generator().manual_seed(T)
    q, k, v = (torch.randn(1, HEADS, T, HEAD_DIM, generator=g).to(dtype) for _ in range(3))
    return q, k, v, torch.arange(T)


def run_case(case: str, q, k, v, pos, inv_freq) -> torch.Tensor:
    """One forward of ``case``: "sdpa", or "METHOD explicit" / "METHOD fast"."""
    if case == "sdpa":
        return F.scaled_dot_product_attention(
            _rot(q, pos, inv_freq, "half"), _rot(k, pos, inv_freq, "half"), v, is_causal=True
        )
    name, path = case.split()
    method = parse(METHODS[name], len(pos))
    if path == "fast":
        assert fast_applies(q, k, v, None)  # method_attention picks the fast path here
        return method_attention(q, k, v, pos, pos, method, inv_freq=inv_freq)
    return method_attention(q, k, v, pos, pos, method, inv_freq=inv_freq, fast=False)


def seconds(case: str, args: tuple) -> tuple[float, torch.Tensor]:
    """CPU seconds of this process (one thread) for one forward of ``case``, and its output."""
    with torch.no_grad():
        t0 = time.process_time()
        out = run_case(case, *args)
        return time.process_time() - t0, out


def measure(methods: list[str], lengths: list[int], repeats: int, dtype: torch.dtype) -> tuple[dict, dict]:
    """({L: {case: min seconds over the repeats}}, {L: {method: max |fast - explicit|}}), cases interleaved."""
    cases = ["sdpa"] + [f"{m} {path}" for m in methods for path in ("explicit", "fast")]
    inv_freq = rope_inv_freq(HEAD_DIM, 10000.0)
    small = (*inputs(1024, dtype), inv_freq)
    for case in cases:  # warm-up: first-call allocations and kernel selection
        seconds(case, small)
    table, diffs = {}, {}
    for T in lengths:
        args, best, outs = (*inputs(T, dtype), inv_freq), {c: float("inf") for c in cases}, {}
        for _ in range(repeats):
            for case in cases:
                sec, outs[case] = seconds(case, args)
                best[case] = min(best[case], sec)
        table[str(T)] = best
        diffs[str(T)] = {
            m: float((outs[f"{m} fast"].float() - outs[f"{m} explicit"].float()).abs().max()) for m in methods
        }
        print(T, {c: round(v, 3) for c, v in best.items()}, diffs[str(T)], file=sys.stderr, flush=True)
    return table, diffs


def report(res: dict, command: str) -> str:
    lengths = list(res["seconds"])
    header = ["case"]
    for T in lengths:
        label = f"{int(T) // 1024}K"
        header += [f"{label} s", f"{label} / SDPA", f"{label} explicit / fast"]
    rows = []
    for case in res["seconds"][lengths[0]]:
        row = [case if case != "sdpa" else "causal SDPA (RoPE)"]
        for T in lengths:
            tab = res["seconds"][T]
            speedup = ""
            if case.endswith(" fast"):
                speedup = f"{tab[case.replace(' fast', ' explicit')] / tab[case]:.2f}"
            row += [f"{tab[case]:.2f}", f"{tab[case] / tab['sdpa']:.2f}", speedup]
        rows.append(row)
    diff_rows = [[m, METHODS[m]] + [f"{res['max_abs_diff'][T][m]:.1e}" for T in lengths] for m in res["methods"]]
    diff_header = ["method", "spec"] + [f"{int(T) // 1024}K max abs diff" for T in lengths]
    lines = [
        "# Long-context methods: attention prefill, explicit and fast paths",
        "",
        f"Command: `{command}`",
        "",
        f"Attention alone: 1 sequence x {HEADS} heads x {HEAD_DIM} head dim, {res['dtype']}, RoPE (theta 10000), "
        f"random q, k, v, `torch.no_grad()`, block 512, {res['threads']} thread(s), CPU seconds of the process "
        f"(`time.process_time`), min of {res['repeats']} interleaved repeats; / SDPA = seconds / causal SDPA's "
        f"at the same length (its q and k rotated inside the timing). explicit: `posenc.methods.method_attention` with "
        f"`fast=False` (the path `method_attention` takes with grad enabled); fast: `method_attention` under no grad. "
        f"{res['platform']}, torch {res['torch']}, load average {res['load']}.",
        "",
        markdown_table(header, rows),
        "",
        f"Largest absolute difference between the fast and the explicit path's outputs ({res['dtype']}):",
        "",
        markdown_table(diff_header, diff_rows),
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.set_num_threads(args.threads)
    res = {
        "threads": args.threads,
        "dtype": args.dtype,
        "repeats": args.repeats,
        "methods": args.methods,
        "specs": {m: METHODS[m] for m in args.methods},
        "torch": torch.__version__,
        "platform": platform.processor() or platform.machine(),
    }
    res["seconds"], res["max_abs_diff"] = measure(args.methods, args.lengths, args.repeats, dtype)
    res["load"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    command = " ".join(["python benchmarks/method_prefill.py", *sys.argv[1:]])
    res["command"] = command
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "method_prefill" if args.dtype == "float32" else f"method_prefill_{args.dtype}"
    atomic_write_bytes(args.out / f"{stem}.json", json.dumps(res, indent=1).encode())
    md = report(res, command)
    atomic_write_bytes(args.out / f"{stem}.md", md.encode())
    print(md)


if __name__ == "__main__":
    main()
