"""Catalogue benchmark: PaTH blockwise vs its product-building reference, PaTH peak
memory, and xPos / PoPE attention time relative to RoPE.

    .venv/bin/python benchmarks/bench_catalogue.py [--threads 1] [--out benchmarks/results]

Times are medians of torch.utils.benchmark measurements after a warm-up call,
forward only. Peak memory is the peak resident-set growth of one call in a fresh
subprocess (VmHWM after resetting it, minus VmRSS before), forward in inference mode. The load average
before and after is recorded: the machine is shared, so ratios are more
trustworthy than absolute times.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import torch.utils.benchmark as tb

from posenc import encodings
from posenc.attention import attention
from posenc.encodings.base import Dims, Inputs
from posenc.encodings.householder import path_attention
from posenc.encodings.householder_naive import path_attention_naive
from posenc.reports.render import markdown_table
from posenc.store.checkpoint import atomic_write_bytes

LONG_SCHEMES = [
    "rope",
    "xpos",
    "pope",
    "path",
    "forget",
    "acc-rand-qkv+forget",
    "acc-rand-qkv+alibi",
    "path+forget",
    "fire",
    "cope",
    "dape",
]


def path_inputs(T, B=1, H=1, D=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, D, generator=g) for _ in range(3))
    w = F.normalize(torch.randn(B, H, T, D, generator=g), dim=-1)
    return q, k, v, w, 2 * torch.rand(B, H, T, generator=g)


def median_seconds(fn, runs: int, warmup: int = 1) -> tuple[float, int]:
    """Median over ``runs`` single-call torch.utils.benchmark measurements, after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    timer = tb.Timer(stmt="fn()", globals={"fn": fn})
    times = sorted(timer.timeit(1).median for _ in range(runs))
    return times[len(times) // 2], runs


def bench_path(T: int) -> dict:
    args = path_inputs(T)
    with torch.inference_mode():
        fast = path_attention(*args, block_size=64)
        ref = path_attention_naive(*args)
        err = float((fast - ref).abs().max())
        t_fast, n_fast = median_seconds(lambda: path_attention(*args, block_size=64), 7)
        t_ref, n_ref = median_seconds(
            lambda: path_attention_naive(*args), 3, warmup=0
        )  # ~1 min a call; warm from `ref`
    return {
        "T": T,
        "B": 1,
        "H": 1,
        "D": 64,
        "block": 64,
        "blockwise_s": t_fast,
        "blockwise_runs": n_fast,
        "naive_s": t_ref,
        "naive_runs": n_ref,
        "speedup": t_ref / t_fast,
        "max_abs_diff": err,
    }


# Peak resident memory of one call: reset the high-water mark (Linux clear_refs "5"), run,
# then VmHWM minus the resident size before the call.
_PEAK = """
def _status(key):
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(key + ":")) / 1024
def assert_finite(x):
    assert bool(x.isfinite().all())
def peak_growth(fn):
    open("/proc/self/clear_refs", "w").write("5")
    before = _status("VmRSS")
    fn()
    return _status("VmHWM") - before
"""

_MEM_CHILD = (
    _PEAK
    + """
import sys, torch
torch.set_num_threads(1)
sys.path.insert(0, {bench!r})
from bench_catalogue import path_inputs
from posenc.encodings.householder import path_attention
args = path_inputs({T})
with torch.inference_mode():
    print(peak_growth(lambda: path_attention(*args, block_size={C})))
"""
)


def bench_path_memory(T: int, C: int = 64) -> dict:
    code = _MEM_CHILD.format(bench=str(Path(__file__).parent), T=T, C=C)
    mb = float(
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()[-1]
    )
    inputs_mb = 5 * T * 64 * 4 / 2**20
    return {
        "T": T,
        "D": 64,
        "block": C,
        "peak_growth_MiB": mb,
        "inputs_MiB": inputs_mb,
        "one_T_by_T_float32_MiB": T * T * 4 / 2**20,
    }


_LONG_CHILD = (
    _PEAK
    + """
import time, torch
torch.set_num_threads(1)
from posenc.model import build_model
model = build_model({{"n_layer": 1, "n_head": 2, "d_model": 64, "train_length": {L0}, "encoding": {scheme!r}}}).eval()
tokens = torch.randint(0, 256, (1, {T}))
t0 = time.time()
with torch.inference_mode():
    mb = peak_growth(lambda: assert_finite(model.token_nll(tokens[:, :-1], tokens[:, 1:])))
print(mb, time.time() - t0)
"""
)


def bench_long_eval(schemes: list[str], L0: int = 128, multiple: int = 128) -> list[dict]:
    """Forward of a 1-layer, 2-head, width-64 model at 128 x L0 tokens per scheme, in a fresh process each."""
    T = L0 * multiple + 1
    out = []
    for scheme in schemes:
        code = _LONG_CHILD.format(L0=L0, T=T, scheme=scheme)
        mb, sec = map(
            float,
            subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()[
                -2:
            ],
        )
        out.append(
            {
                "scheme": scheme,
                "T": T - 1,
                "peak_growth_MiB": mb,
                "seconds": sec,
                "one_T_by_T_float32_per_head_MiB": (T - 1) ** 2 * 4 / 2**20,
            }
        )
    return out


def bench_ratios(T: int) -> dict:
    H, D = 4, 64
    dims = Dims(n_head=H, head_dim=D, d_model=H * D, vocab_size=256, train_length=512)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, H, T, D, generator=g) for _ in range(3))
    inp = Inputs(torch.zeros(1, T, H * D), torch.arange(T), torch.zeros(1, T, dtype=torch.long))
    rope, xpos, pope = (encodings.get(n, dims) for n in ("rope", "xpos", "pope"))
    fns = {
        "rope": lambda: attention(q, k, v, phases=rope.phases(inp)),
        "xpos": lambda: xpos.attend(q, k, v, inp),
        "pope": lambda: pope.attend(q, k, v, inp),
    }
    out = {"T": T, "B": 1, "H": H, "D": D}
    with torch.inference_mode():
        for name, fn in fns.items():
            out[f"{name}_s"], out[f"{name}_runs"] = median_seconds(fn, 9)
    out["xpos_over_rope"] = out["xpos_s"] / out["rope_s"]
    out["pope_over_rope"] = out["pope_s"] / out["rope_s"]
    return out


def markdown(res: dict) -> str:
    p, m, r, long = res["path"], res["path_memory"], res["ratios"], res["long_eval"]
    path = markdown_table(
        ["T", "B x H x D", "blockwise (s)", "naive reference (s)", "speed-up", "max abs diff"],
        [
            [
                p["T"],
                f"{p['B']} x {p['H']} x {p['D']}",
                f"{p['blockwise_s']:.3f} (median of {p['blockwise_runs']})",
                f"{p['naive_s']:.2f} (median of {p['naive_runs']})",
                f"**{p['speedup']:.0f}x**",
                f"{p['max_abs_diff']:.1e}",
            ]
        ],
    )
    memory = markdown_table(
        ["T", "D", "block", "peak RSS growth (MiB)", "inputs q,k,v,w (MiB)", "one T x T float32 matrix (MiB)"],
        [
            [
                m["T"],
                m["D"],
                m["block"],
                f"{m['peak_growth_MiB']:.0f}",
                f"{m['inputs_MiB']:.0f}",
                f"{m['one_T_by_T_float32_MiB']:.0f}",
            ]
        ],
    )
    ratios = markdown_table(
        ["scheme", "median (ms)", "ratio to RoPE"],
        [
            ["rope (rotate + SDPA)", f"{r['rope_s'] * 1e3:.1f}", "1.00"],
            [
                "xpos (blockwise offsets, SDPA per 512-query block)",
                f"{r['xpos_s'] * 1e3:.1f}",
                f"{r['xpos_over_rope']:.2f}",
            ],
            ["pope (2D features, SDPA)", f"{r['pope_s'] * 1e3:.1f}", f"{r['pope_over_rope']:.2f}"],
        ],
    )
    evals = markdown_table(
        ["scheme", "peak RSS growth (MiB)", "seconds"],
        [[f"`{e['scheme']}`", f"{e['peak_growth_MiB']:.0f}", f"{e['seconds']:.1f}"] for e in long],
    )
    return f"""# Catalogue benchmark

Machine: {res["machine"]}; torch {res["torch"]}; {res["threads"]} thread(s).
Load average (1, 5, 15 min) before: {res["load_before"]}, after: {res["load_after"]} (shared 2-core CPU:
absolute times are noisy, ratios less so). Forward only, float32, medians after a warm-up.

## PaTH: blockwise (UT transform + right-to-left scan, block {p["block"]}) vs the product-building reference

{path}

Goal >= 10x: {"met" if p["speedup"] >= 10 else "NOT met"}.

## PaTH peak memory (forward, inference mode, fresh process)

{memory}

## Attention time relative to RoPE (T = {r["T"]}, B x H x D = {r["B"]} x {r["H"]} x {r["D"]})

{ratios}

## Evaluation at 128x the training length (1 layer, 2 heads of 32, L0 = 128, T = {long[0]["T"]})

Forward of the whole model in inference mode, fresh process per scheme; one T x T float32 score
matrix per head would be {long[0]["one_T_by_T_float32_per_head_MiB"]:.0f} MiB.

{evals}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    res = {
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs",
        "torch": torch.__version__,
        "threads": args.threads,
        "load_before": [round(x, 2) for x in os.getloadavg()],
    }
    res["ratios"] = bench_ratios(2048)
    res["path"] = bench_path(2048)
    res["path_memory"] = bench_path_memory(8192)
    res["long_eval"] = bench_long_eval(LONG_SCHEMES)
    res["load_after"] = [round(x, 2) for x in os.getloadavg()]
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(args.out / "catalogue.json", (json.dumps(res, indent=2) + "\n").encode())
    atomic_write_bytes(args.out / "catalogue.md", markdown(res).encode())
    print(markdown(res))


if __name__ == "__main__":
    main()
