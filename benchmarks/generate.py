"""Generation speed and decode-vs-parallel agreement of the default model, per scheme.

    .venv/bin/python benchmarks/generate.py                 # the default preset's schemes (~2 min on 2 cores)
    .venv/bin/python benchmarks/generate.py --schemes rope path --new-tokens 128

For each scheme, the default ``compare`` model (4 layers, width 256; random weights:
speed does not depend on them) generates ``--new-tokens`` tokens greedily after a
``--prompt``-token prompt with the KV cache (``LM.generate``); tokens/s counts the new
tokens over the whole call (prefill included). Agreement: the largest absolute logit
difference between the parallel forward and prefill + token-by-token decoding of one
random sequence, float32 and float64. Writes ``results/generate.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from posenc.checkpoint import atomic_write_bytes
from posenc.config import load_preset
from posenc.model import Cache, build_model
from posenc.reporting import markdown_table

OUT = Path(__file__).resolve().parent / "results"


def decode_error(scheme: str, dtype: torch.dtype, T: int = 64, prefill: int = 16) -> float:
    """max |parallel - decoded| logits of a 2-layer model on one random sequence of T tokens."""
    torch.manual_seed(0)
    model = build_model({"encoding": scheme, "n_layer": 2, "n_head": 4, "d_model": 64, "train_length": 32}).to(dtype).eval()
    x = torch.randint(0, 256, (1, T))
    cache = Cache(len(model.blocks))
    with torch.no_grad():
        steps = [model.decode(x[:, :prefill], cache)] + [model.decode(x[:, t : t + 1], cache) for t in range(prefill, T)]
        return (torch.cat(steps, dim=1) - model(x)).abs().max().item()


def tokens_per_second(scheme: str, prompt: int, new: int) -> float:
    torch.manual_seed(0)
    model = build_model(load_preset("default").model.model_copy(update={"encoding": scheme})).eval()
    ids = torch.randint(0, 256, (prompt,))
    model.generate(ids, 4, temperature=0)  # warm-up
    t0 = time.perf_counter()
    model.generate(ids, new, temperature=0)
    return new / (time.perf_counter() - t0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--schemes", nargs="+", help="default: the default preset's schemes")
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens (default 128)")
    p.add_argument("--new-tokens", type=int, default=256, help="generated tokens (default 256)")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    schemes = args.schemes or load_preset("default").schemes
    rows = []
    for s in schemes:
        row = {"scheme": s, "tokens_per_s": tokens_per_second(s, args.prompt, args.new_tokens),
               "max_err_float32": decode_error(s, torch.float32), "max_err_float64": decode_error(s, torch.float64)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    meta = {"prompt": args.prompt, "new_tokens": args.new_tokens, "threads": torch.get_num_threads(), "load_average": os.getloadavg(),
            "machine": platform.processor() or platform.machine(), "torch": torch.__version__}
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(args.out / "generate.json", json.dumps({"meta": meta, "rows": rows}, indent=1).encode())
    table = markdown_table(["scheme", "tokens/s", "max err float32", "max err float64"],
                           [[r["scheme"], f"{r['tokens_per_s']:.0f}", f"{r['max_err_float32']:.1e}", f"{r['max_err_float64']:.1e}"] for r in rows])
    head = (f"# Generation with the KV cache\n\nDefault model, greedy, {args.prompt}-token prompt + {args.new_tokens} new tokens, "
            f"{meta['threads']} threads, torch {meta['torch']}, load average {meta['load_average'][0]:.1f}. Errors: max |parallel - decoded| logits (2-layer model, 64 tokens).\n\n")
    atomic_write_bytes(args.out / "generate.md", (head + table + "\n").encode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
