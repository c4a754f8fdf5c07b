"""PaTH prefill and training speed against RoPE on the default ``compare`` model (CPU, one thread).

    PYTHONPATH=src .venv/bin/python benchmarks/path_prefill.py --label new           # 4K and 16K, train
    PYTHONPATH=/path/to/main/src .venv/bin/python benchmarks/path_prefill.py --label old

1. Evaluation forward (``model.eval()``, ``torch.no_grad``) of the default model (4 layers, width 256,
   4 heads x 64) on one random sequence of each ``--lengths``, per scheme (rope, path, path+forget):
   the minimum over ``--repeats`` rounds, the schemes interleaved within each round.
2. Training tokens/s of the default model (batch 16 x 128, AdamW + clipping, as ``run.py``'s train
   section): per round ``--train-steps`` steps per scheme after one warm-up step, schemes interleaved,
   the fastest round.

Writes ``results/path_prefill_<label>.json`` and rebuilds ``results/path_prefill.md`` from every
label's JSON present (so an old and a new run, e.g. from a worktree of main, sit side by side).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch

from posenc.config.plan import load_preset
from posenc.model import build_model
from posenc.train.optimizer import make_optimizer

OUT = Path(__file__).resolve().parent / "results"
SCHEMES = ("rope", "path", "path+forget")


def model_for(scheme: str, train: bool):
    torch.manual_seed(0)
    model = build_model(dataclasses.replace(load_preset("default").model, encoding=scheme))
    return model.train() if train else model.eval()


def prefill_seconds(schemes, lengths, repeats: int) -> dict:
    """{scheme: {T: min seconds}} of one evaluation forward of a T-token sequence."""
    models = {s: model_for(s, train=False) for s in schemes}
    best = {s: {T: float("inf") for T in lengths} for s in schemes}
    for r in range(repeats):
        for T in lengths:
            x = torch.randint(0, 256, (1, T), generator=torch.Generator().manual_seed(T))
            for s, model in models.items():
                with torch.no_grad():
                    t0 = time.perf_counter()
                    model(x)
                    best[s][T] = min(best[s][T], time.perf_counter() - t0)
        print(f"prefill round {r + 1}/{repeats}: {best}", file=sys.stderr)
    return best


def train_tokens_per_s(schemes, steps: int, repeats: int) -> dict:
    """{scheme: tokens/s} of the fastest round of ``steps`` training steps (batch 16 x 128)."""
    preset = load_preset("default")
    cases = {}
    for s in schemes:
        model = model_for(s, train=True)
        opt = make_optimizer(model, preset.train)
        x, y = torch.randint(0, 256, (2, preset.train.batch_size, preset.model.train_length))

        def step(model=model, opt=opt, x=x, y=y):
            loss = model.token_nll(x, y).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), preset.train.grad_clip)
            opt.step()

        step()  # warm-up
        cases[s] = (step, x.numel())
    best = {s: float("inf") for s in schemes}
    for r in range(repeats):
        for s, (step, _) in cases.items():
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            best[s] = min(best[s], (time.perf_counter() - t0) / steps)
        print(f"train round {r + 1}/{repeats}: {best}", file=sys.stderr)
    return {s: cases[s][1] / best[s] for s in schemes}


def markdown() -> str:
    runs = [json.loads(p.read_text()) for p in sorted(OUT.glob("path_prefill_*.json"))]
    lines = [
        "# PaTH prefill and training vs RoPE (default model, CPU, 1 thread)",
        "",
        "Written by `benchmarks/path_prefill.py` (its docstring: what is timed). Commands:",
        "",
    ]
    lines += [
        f"- {r['label']} ({r['commit']}): `{r['command']}`, load {r['load_before']} -> {r['load_after']}" for r in runs
    ]
    lines += ["", "## Evaluation forward, one sequence: seconds (ratio to RoPE)", ""]
    lengths = sorted({int(T) for r in runs for T in r["prefill"]["rope"]})
    lines += [
        "| run | scheme | " + " | ".join(f"{T // 1024}K" for T in lengths) + " |",
        "|---|---|" + "---|" * len(lengths),
    ]
    for r in runs:
        rope = r["prefill"]["rope"]
        for s, row in r["prefill"].items():
            cells = [
                f"{row[str(T)]:.2f} ({row[str(T)] / rope[str(T)]:.2f}x)" if str(T) in row else "-" for T in lengths
            ]
            lines.append(f"| {r['label']} | {s} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Training, batch 16 x 128: tokens/s (ratio to RoPE)",
        "",
        "| run | scheme | tokens/s |",
        "|---|---|---|",
    ]
    for r in runs:
        for s, tps in r["train"].items():
            lines.append(f"| {r['label']} | {s} | {tps:.0f} ({tps / r['train']['rope']:.2f}x) |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--label", required=True, help="name of this run in the table (old, new)")
    ap.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--schemes", nargs="+", default=list(SCHEMES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--train-steps", type=int, default=3)
    ap.add_argument("--train-schemes", nargs="+", default=["rope", "path"])
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    import posenc

    commit = os.popen(f"git -C {Path(posenc.__file__).parent} rev-parse --short HEAD 2>/dev/null").read().strip()
    res = {
        "label": args.label,
        "commit": commit,
        "command": " ".join(["benchmarks/path_prefill.py", *(argv or sys.argv[1:])]),
        "load_before": [round(x, 2) for x in os.getloadavg()],
    }
    res["prefill"] = {
        s: {str(T): t for T, t in row.items()}
        for s, row in prefill_seconds(args.schemes, args.lengths, args.repeats).items()
    }
    res["train"] = train_tokens_per_s(args.train_schemes, args.train_steps, args.repeats)
    res["load_after"] = [round(x, 2) for x in os.getloadavg()]
    OUT.mkdir(exist_ok=True)
    (OUT / f"path_prefill_{args.label}.json").write_text(json.dumps(res, indent=1) + "\n")
    (OUT / "path_prefill.md").write_text(markdown())
    print(markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
