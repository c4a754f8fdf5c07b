"""Memory of streaming a long text through attention sinks' bounded cache on a pretrained model.

    .venv/bin/python benchmarks/stream_memory.py                     # SmolLM2-135M, 2K / 8K / 32K targets
    .venv/bin/python benchmarks/stream_memory.py --model path/to/llama --targets 1024 4096

For each number of targets N, a fresh process (one thread) loads the model, puts
``sinks:n_sink=4,window=W`` on it (``Adaptation.set_method``) and streams the first N targets of
the Shakespeare held-out works, joined in order, through ``posenc.hf.sink_cache.streaming_nll``
(256 tokens a chunk). Reported: the process's peak resident memory (``VmHWM``), the largest cache
held between chunks, perplexity, and seconds. With the bounded cache the memory should not grow with
N. Writes ``results/stream_memory.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from posenc.store.stamp import stamp_line

OUT = Path(__file__).resolve().parent / "results"


def child(model: str, spec: str, targets: int) -> dict:
    """One measurement in this process (run fresh per N, so VmHWM is this N's peak)."""
    import numpy as np
    import torch

    from posenc.data.corpora import load_corpus
    from posenc.hf import loading
    from posenc.hf.adaptation import Adaptation
    from posenc.hf.sink_cache import streaming_nll
    from posenc.store.stamp import run_stamp

    torch.set_num_threads(1)
    loaded = loading.load(model)
    ids = [loaded.tokenizer(d.text, add_special_tokens=False)["input_ids"] for d in load_corpus("shakespeare").val]
    text = torch.as_tensor(np.concatenate(ids)[: targets + 1], dtype=torch.int64)
    adapted = Adaptation(loaded.model)
    method = adapted.set_method(spec)
    t0 = time.time()
    nll, peak = streaming_nll(adapted.model, method, text)
    seconds = time.time() - t0
    hwm = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM"))
    return {
        "targets": int(nll.shape[0]),
        "ppl": float(nll.double().mean().exp()),
        "peak_cache_bytes": peak,
        "vm_hwm_mib": int(hwm.split()[1]) / 1024,
        "seconds": seconds,
        "label": method.describe(),
        "stamp": run_stamp(precision="fp32"),  # what decides the numbers, as this process saw them
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--method", default="sinks:n_sink=4,window=1020")
    p.add_argument("--targets", type=int, nargs="+", default=[2048, 8192, 32768])
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.model, args.method, args.child)))
        return

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    rows, load = [], [os.getloadavg()[0]]
    for n in args.targets:
        cmd = [sys.executable, __file__, "--model", args.model, "--method", args.method, "--child", str(n)]
        rows.append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout))
        print(rows[-1], flush=True)
    load.append(os.getloadavg()[0])
    stamps = [r.pop("stamp") for r in rows]
    meta = {"model": args.model, "method": args.method, "stamp": stamps[0], "load_average_before_after": load}
    OUT.mkdir(exist_ok=True)
    (OUT / "stream_memory.json").write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    lines = [
        f"# Streaming through attention sinks: {args.model}, {rows[0]['label']}",
        "",
        "`.venv/bin/python benchmarks/stream_memory.py` (one thread, a fresh process per row; "
        f"load average {load[0]:.1f} before, {load[1]:.1f} after)",
        "",
        stamp_line(stamps[0]),
        "",
        "| targets | perplexity | peak cache (MiB) | peak resident memory (MiB) | seconds |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['targets']} | {r['ppl']:.3f} | {r['peak_cache_bytes'] / 2**20:.1f} | {r['vm_hwm_mib']:.0f} | "
        f"{r['seconds']:.0f} |"
        for r in rows
    ]
    (OUT / "stream_memory.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
