"""The random accumulated draw, before and after the counter-based hash, at the default and the paper model's batch
shape.

    .venv/bin/python benchmarks/draw.py          # writes results/draw.{json,md}

Per layer and training step, the draw is (rows, heads, positions, blocks) uniforms:
default model 16 x 4 x 128 x 32, paper model 64 x 12 x 512 x 32. "before" is the
generator-per-row draw posenc used until the counter-based hash replaced it (one
``numpy.random.SeedSequence`` and one ``torch.Generator`` per batch row, a host
read of the counter); "after" is ``posenc.encodings.draw.counter_uniform``, eager
and under ``torch.compile`` (which fuses the hash into one loop). Median of 5 runs, CPU.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from posenc.encodings.draw import counter_uniform
from posenc.reports.render import markdown_table
from posenc.store.checkpoint import atomic_write_bytes

OUT = Path(__file__).resolve().parent / "results"
SHAPES = {"default (16 x 4 x 128 x 32)": (16, 4, 128, 32), "paper (64 x 12 x 512 x 32)": (64, 12, 512, 32)}


def before(draws: torch.Tensor, B: int, H: int, T: int, half: int) -> torch.Tensor:
    """The former draw: a generator per global batch row, seeded by (seed, counter, row)."""
    draw = int(draws)  # the host read that broke torch.compile graphs
    rows = []
    for r in range(B):
        seed = int(np.random.SeedSequence([0, draw, r]).generate_state(1, np.uint64)[0])
        rows.append(torch.rand(H, T, half, generator=torch.Generator().manual_seed(seed)))
    return torch.stack(rows) * 2 - 1


def after(draws: torch.Tensor, B: int, H: int, T: int, half: int) -> torch.Tensor:
    return counter_uniform(0, draws, torch.arange(B), torch.arange(T), H, half)


def median_ms(fn, shape, runs: int = 5) -> float:
    draws = torch.zeros((), dtype=torch.int64)
    fn(draws, *shape)  # warm-up (and compilation)
    times = []
    for i in range(runs):
        draws.fill_(i + 1)
        t0 = time.perf_counter()
        fn(draws, *shape)
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def main() -> int:
    compiled = torch.compile(after, dynamic=False)
    rows = [
        [name, *(f"{median_ms(fn, shape):.1f}" for fn in (before, after, compiled))] for name, shape in SHAPES.items()
    ]
    meta = {
        "threads": torch.get_num_threads(),
        "load_average": os.getloadavg(),
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
    }
    OUT.mkdir(exist_ok=True)
    atomic_write_bytes(OUT / "draw.json", json.dumps({"meta": meta, "rows": rows}, indent=1).encode())
    head = (
        f"# Random accumulated draw, ms per layer and step (CPU, {meta['threads']} threads, "
        f"torch {meta['torch']}, load average {meta['load_average'][0]:.1f})\n\n"
    )
    table = markdown_table(
        [
            "shape (rows x heads x positions x blocks)",
            "before: generator per row",
            "after: counter hash",
            "after, compiled",
        ],
        rows,
    )
    atomic_write_bytes(OUT / "draw.md", (head + table + "\n").encode())
    print(head + table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
