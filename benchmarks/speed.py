"""posenc at the machine's speed: training, prefill and generation, each beside the CPU's measured matmul peak.

    .venv/bin/python benchmarks/speed.py  # every section, default schemes + path (~30 min, 1 thread)
    .venv/bin/python benchmarks/speed.py --sections train --schemes rope alibi --rounds 2

One interleaved run, one thread, the default ``compare`` model (4 layers, width 256, 4 heads, vocabulary 256):

- ``peak``: square matmuls (n = 128, 512, 1024) in float32 and bfloat16: GFLOP/s, the physical limit on this
  hardware for each precision (the best n is the peak the fractions below divide by).
- ``train``: tokens/s of one training step (batch 16 x 128, AdamW, clipping) per scheme in fp32 and bf16 autocast
  (``train.precision``), eager and under ``torch.compile`` (``train.compile``), the four modes of a scheme timed
  alternately, median over rounds; compile seconds (first compiled step minus a steady one) and the steps a run
  must take for compilation to pay back. FLOPs per token: 6 N + 6 n_layer T d (N the non-embedding weights; the
  causal attention's QK and AV products).
- ``prefill``: the evaluation forward (``torch.no_grad``, one sequence, fp32) at 4K and 16K tokens; seconds, ratio
  to RoPE, fraction of the fp32 peak (2 N + 2 n_layer T d FLOPs per token).
- ``generate``: ``benchmarks/generate.py``'s one-token steps through the cache at 1K / 4K / 16K beside transformers'
  LlamaForCausalLM of the same size.

Writes ``results/speed.{json,md}`` with the machine, the detected bf16 units and the load average before and after.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmark scripts
from generate import HF, llama, time_per_token  # noqa: E402
from run import TRAIN_TOKENS, _warm, default_model, loadavg, train_case  # noqa: E402

from posenc.config.plan import load_preset  # noqa: E402
from posenc.model import build_model  # noqa: E402
from posenc.reports.render import markdown_table  # noqa: E402
from posenc.store.checkpoint import atomic_write_bytes  # noqa: E402
from posenc.store.stamp import bf16_units, cpu_name, git_commit  # noqa: E402

OUT = Path(__file__).resolve().parent / "results"
MODES = [("fp32", False), ("bf16", False), ("fp32", True), ("bf16", True)]
SECTIONS = ("peak", "train", "prefill", "generate")


def k(n: int | str) -> str:
    """A length as the tables label it: 512, 4K."""
    n = int(n)
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def mode_name(precision: str, compiled: bool) -> str:
    return f"{precision}{' compiled' if compiled else ''}"


def matmul_peak(sizes=(128, 512, 1024), seconds: float = 0.5) -> dict:
    """GFLOP/s of n x n matmuls per dtype, best of 3 bursts of ``seconds``."""
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        for n in sizes:
            a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
            reps = max(1, int(seconds * 50e9 / (2 * n**3)))
            best = 0.0
            for _ in range(4):  # the first burst warms up
                t0 = time.perf_counter()
                for _ in range(reps):
                    a @ b
                best = max(best, 2 * n**3 * reps / (time.perf_counter() - t0) / 1e9)
            out[f"{str(dtype).removeprefix('torch.')} n={n}"] = best
    return out


def peak_of(peak: dict, precision: str) -> float:
    key = "float32" if precision == "fp32" else "bfloat16"
    return max(v for k, v in peak.items() if k.startswith(key + " "))


def weights(cfg) -> int:
    """Non-embedding weights of the default model (the matmuls per token)."""
    model = build_model(cfg)
    return sum(p.numel() for n, p in model.named_parameters() if "emb" not in n)


def bench_train(schemes: list[str], rounds: int, modes=MODES) -> dict:
    # every case compiles the same LM.token_nll code under other guards (model, autocast): past dynamo's default
    # limit of 8 entries it would fall back to eager silently; a training run compiles one model only
    torch._dynamo.config.recompile_limit = 4 * len(schemes) * len(modes)
    timers, rows = {}, {}
    for s in schemes:
        for precision, compiled in modes:
            t0 = time.perf_counter()
            timer, err = _warm(train_case, s, compiled, precision)
            first = time.perf_counter() - t0
            if err:
                rows.setdefault(s, {})[mode_name(precision, compiled)] = {"error": err}
                continue
            timers[s, precision, compiled] = (timer, first)
    times = {c: [] for c in timers}
    for r in range(rounds):
        for c, (timer, _) in timers.items():
            times[c].append(timer.timeit(2).median)
        print(f"train round {r + 1}/{rounds} done, load {loadavg()}", file=sys.stderr, flush=True)
    for (s, precision, compiled), (_, first) in timers.items():
        step = float(np.median(times[s, precision, compiled]))
        cell = {"tokens_per_s": TRAIN_TOKENS / step, "step_s": step}
        if compiled:
            eager = float(np.median(times[s, precision, False])) if (s, precision, False) in times else None
            cell["compile_s"] = max(0.0, first - step)
            cell["break_even_steps"] = cell["compile_s"] / (eager - step) if eager and eager > step else None
        rows.setdefault(s, {})[mode_name(precision, compiled)] = cell
    return rows


def bench_prefill(schemes: list[str], rounds: int, lengths=(4096, 16384)) -> dict:
    models = {}
    for s in schemes:
        torch.manual_seed(0)
        models[s] = build_model(default_model(s)).eval()
    times = {(s, L): [] for s in schemes for L in lengths}
    with torch.no_grad():
        for m in models.values():  # warm-up
            m(torch.randint(0, 256, (1, 256)))
        for r in range(rounds):
            for L in lengths:
                x = torch.randint(0, 256, (1, L), generator=torch.Generator().manual_seed(L))
                for s, m in models.items():
                    t0 = time.perf_counter()
                    m(x)
                    times[s, L].append(time.perf_counter() - t0)
            print(f"prefill round {r + 1}/{rounds} done, load {loadavg()}", file=sys.stderr, flush=True)
    best = {c: min(t) for c, t in times.items()}
    return {
        s: {
            str(L): {"seconds": best[s, L], "ratio": best[s, L] / best["rope", L] if ("rope", L) in best else None}
            for L in lengths
        }
        for s in schemes
    }


def bench_generate(schemes: list[str], contexts=(1024, 4096, 16384), new: int = 16) -> dict:
    base = load_preset("default").model
    models = {}
    for s in schemes:
        torch.manual_seed(0)
        models[s] = build_model(dataclasses.replace(base, encoding=s)).eval()
    torch.manual_seed(0)
    models[HF] = llama(base)
    for name, m in models.items():
        time_per_token(m, name == HF, 64, 2)
    rows = {name: {} for name in models}
    for L in contexts:
        for name, m in models.items():
            sec, _ = time_per_token(m, name == HF, L, new)
            rows[name][str(L)] = 1 / sec
        print(f"generate {L} done, load {loadavg()}", file=sys.stderr, flush=True)
    return rows


def markdown(res: dict, command: str) -> str:
    meta, sec = res["meta"], res["sections"]
    lines = [
        "# posenc at the machine's speed",
        "",
        f"{meta['cpu']}; bf16 units: {', '.join(meta['bf16_units']) or 'none'}; torch {meta['torch']}; "
        f"commit {meta.get('commit') or 'not recorded'}; one thread; "
        f"load average {meta['load_before']} before, {meta['load_after']} after. One interleaved run.",
        "",
        f"Command: `{command}`",
        "",
    ]
    peak = sec.get("peak")
    if peak:
        lines += [
            "## Matmul peak (GFLOP/s, one thread)",
            "",
            markdown_table(["case", "GFLOP/s"], [[k, f"{v:.0f}"] for k, v in peak.items()]),
            "",
        ]
    cfg = default_model("rope")
    n = weights(cfg)
    if "train" in sec:
        flops = 6 * n + 6 * cfg.n_layer * cfg.train_length * cfg.d_model
        head = (
            ["scheme"]
            + [f"{mode_name(*m)} tok/s" for m in MODES]
            + [
                "bf16 / fp32",
                "bf16 x rope fp32",
                "compile s (fp32, bf16)",
                "break-even steps (fp32, bf16)",
                "fp32 % peak",
                "bf16 % peak",
            ]
        )
        rope32 = sec["train"].get("rope", {}).get("fp32", {}).get("tokens_per_s")
        table = []
        for s, r in sec["train"].items():
            tps = [r.get(mode_name(*m), {}).get("tokens_per_s") for m in MODES]
            comp = [r.get(mode_name(p, True), {}) for p in ("fp32", "bf16")]
            table.append(
                [s]
                + [f"{t:,.0f}" if t else r.get(mode_name(*m), {}).get("error", "") for t, m in zip(tps, MODES)]
                + [
                    f"{tps[1] / tps[0]:.2f}x" if tps[0] and tps[1] else "",
                    f"{tps[1] / rope32:.2f}" if rope32 and tps[1] else "",
                    ", ".join(f"{c['compile_s']:.0f}" if "compile_s" in c else "-" for c in comp),
                    ", ".join(f"{c['break_even_steps']:,.0f}" if c.get("break_even_steps") else "never" for c in comp),
                    f"{100 * tps[0] * flops / 1e9 / peak_of(peak, 'fp32'):.0f}%" if peak and tps[0] else "",
                    f"{100 * tps[1] * flops / 1e9 / peak_of(peak, 'bf16'):.0f}%" if peak and tps[1] else "",
                ]
            )
        lines += [
            f"## Training tokens/s (batch 16 x 128; {flops / 1e6:.1f} MFLOP per token)",
            "",
            markdown_table(head, table),
            "",
        ]
    if "prefill" in sec:
        Ls = list(next(iter(sec["prefill"].values())))
        head = (
            ["scheme"]
            + [f"{k(L)} s" for L in Ls]
            + [f"{k(L)} x rope" for L in Ls]
            + [f"{k(L)} % fp32 peak" for L in Ls]
        )

        def fp32_share(L: str, seconds: float) -> float:
            """Percent of the fp32 peak reached by a prefill of ``L`` tokens taking ``seconds``."""
            return (
                100 * int(L) * (2 * n + 2 * cfg.n_layer * int(L) * cfg.d_model) / seconds / 1e9 / peak_of(peak, "fp32")
            )

        table = [
            [s]
            + [f"{r[L]['seconds']:.2f}" for L in Ls]
            + [f"{r[L]['ratio']:.2f}" if r[L]["ratio"] else "" for L in Ls]
            + [f"{fp32_share(L, r[L]['seconds']):.0f}%" if peak else "" for L in Ls]
            for s, r in sec["prefill"].items()
        ]
        lines += [
            "## Prefill (evaluation forward, one sequence, fp32, best of the rounds)",
            "",
            markdown_table(head, table),
            "",
        ]
    if "generate" in sec:
        Cs = list(next(iter(sec["generate"].values())))
        rope = sec["generate"].get("rope")
        head = ["model"] + [f"tok/s {k(c)}" for c in Cs] + [f"x rope {k(c)}" for c in Cs]
        table = [
            [s] + [f"{r[c]:.0f}" for c in Cs] + [f"{r[c] / rope[c]:.2f}" if rope else "" for c in Cs]
            for s, r in sec["generate"].items()
        ]
        lines += [
            "## Generation (prompt of the context, then one-token steps through the cache; "
            f"`{HF}`: transformers' Llama of the same size)",
            "",
            markdown_table(head, table),
            "",
        ]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS)
    p.add_argument("--schemes", nargs="+", help="default: the default preset's schemes and path")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--lengths", nargs="+", type=int, default=[4096, 16384], help="prefill lengths")
    p.add_argument("--contexts", nargs="+", type=int, default=[1024, 4096, 16384], help="generation contexts")
    p.add_argument("--no-compile", action="store_true", help="train eager only (a smoke run)")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    schemes = args.schemes or [*load_preset("default").schemes, "path"]
    if "rope" not in schemes:
        schemes = ["rope", *schemes]
    meta = {
        "cpu": cpu_name(),
        "bf16_units": bf16_units(),
        "torch": torch.__version__,
        "commit": git_commit(),
        "load_before": loadavg(),
    }
    sections = {}
    runs = {
        "peak": matmul_peak,
        "train": lambda: bench_train(schemes, args.rounds, [m for m in MODES if not (args.no_compile and m[1])]),
        "prefill": lambda: bench_prefill(schemes, args.rounds, args.lengths),
        "generate": lambda: bench_generate(schemes, args.contexts),
    }
    for name in SECTIONS:
        if name in args.sections or (name == "peak" and {"train", "prefill"} & set(args.sections)):
            sections[name] = runs[name]()
    meta["load_after"] = loadavg()
    res = {"meta": meta, "sections": sections}
    command = " ".join([".venv/bin/python benchmarks/speed.py", *(argv if argv is not None else sys.argv[1:])])
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(args.out / "speed.json", json.dumps({**res, "command": command}, indent=1).encode())
    atomic_write_bytes(args.out / "speed.md", (markdown(res, command) + "\n").encode())
    print(markdown(res, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
