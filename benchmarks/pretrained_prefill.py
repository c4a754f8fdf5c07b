"""Pretrained inference at the machine's speed: SmolLM2-135M prefill and decode through posenc's transformers path
(native RoPE and each training-free method, float32 and bfloat16) beside llama.cpp on the same GGUF, as a
fraction of the machine's matmul peak measured in the same run.

    .venv/bin/python benchmarks/pretrained_prefill.py                      # 4K and 16K; results/pretrained_prefill.*
    .venv/bin/python benchmarks/pretrained_prefill.py --lengths 4096 --methods none --new 8 --out runs/pp

posenc: ``posenc.hf.loading.load`` (the GGUF dequantized, then cast to the dtype) with
``posenc.hf.adaptation.Adaptation.set_method``; prefill is one forward of L random token ids (seeded) with the
KV cache, logits of the last position only (as ``generate``'s prefill), then ``--new`` greedy decode steps.
llama.cpp: ``llama_cpp.Llama`` (llama-cpp-python, the ``llamacpp`` extra; skipped with a note when it is not
installed) on the same GGUF file, its quantized weights in its own kernels, ``eval`` of the same ids, then one
token at a time. Both use ``--threads`` threads (default: every core). Seconds are wall-clock, one run per case
(the machine's load average is recorded). FLOP per prefill token: 2 x the non-embedding matmul weights (the LM
head once per sequence, left out) + 2 x n_layer x L x (n_head x head_dim) for the causal attention (QK^T and AV
over L/2 keys on average); % of peak = FLOP/s over the dtype's matmul peak (n = 1024, the same threads).
llama.cpp's row is measured against the float32 peak (its Q4_1 kernels have no peak of their own here).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import loadavg  # noqa: E402

from posenc.hf import loading  # noqa: E402
from posenc.hf.adaptation import Adaptation  # noqa: E402
from posenc.reports.render import markdown_table  # noqa: E402
from posenc.store.checkpoint import atomic_write_bytes  # noqa: E402
from posenc.store.stamp import bf16_units, cpu_name, git_commit  # noqa: E402

METHODS = ("none", "self-extend:group=4", "dual-chunk", "lm-infinite", "sinks")


def matmul_peak(n: int = 1024, seconds: float = 1.0) -> dict[str, float]:
    """GFLOP/s of n x n matmuls in float32 and bfloat16 with the current threads, best of 3 bursts after a warm-up."""
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        reps = max(1, int(seconds * 100e9 / (2 * n**3)))
        best = 0.0
        for _ in range(4):
            t0 = time.perf_counter()
            for _ in range(reps):
                a @ b
            best = max(best, 2 * n**3 * reps / (time.perf_counter() - t0) / 1e9)
        out[str(dtype).removeprefix("torch.")] = best
    return out


def flop_per_token(config, length: int) -> float:
    """Prefill FLOP per token of a Llama-family config at ``length`` (module docstring)."""
    d, f, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    head_dim = getattr(config, "head_dim", None) or d // config.num_attention_heads
    q, kv = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    weights = layers * (d * q + 2 * d * kv + q * d + 3 * d * f)
    return 2 * weights + 2 * layers * length * q


@torch.inference_mode()
def posenc_case(model, ids: torch.Tensor, new: int) -> dict:
    """Prefill seconds of ``ids`` (1, L) with the cache, then ``new`` greedy decode steps' seconds per token."""
    t0 = time.perf_counter()
    out = model(ids, use_cache=True, logits_to_keep=1)
    prefill = time.perf_counter() - t0
    cache, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
    t0 = time.perf_counter()
    for _ in range(new):
        out = model(token, cache=cache, use_cache=True)
        cache, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
    return {"prefill_s": prefill, "decode_s_per_token": (time.perf_counter() - t0) / max(1, new)}


def llamacpp_case(gguf: Path, ids: list[int], new: int, threads: int, flash: bool) -> dict:
    """The same through llama.cpp: ``eval`` of ``ids``, then ``new`` single-token evals of its greedy picks."""
    from llama_cpp import Llama

    llm = Llama(
        model_path=str(gguf),
        n_ctx=len(ids) + new + 8,
        n_batch=512,
        n_threads=threads,
        n_threads_batch=threads,
        flash_attn=flash,
        logits_all=False,
        verbose=False,
    )
    t0 = time.perf_counter()
    llm.eval(ids)
    prefill = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(new):
        llm.eval([int(llm.scores[llm.n_tokens - 1].argmax())])
    decode = (time.perf_counter() - t0) / max(1, new)
    llm.close()
    return {"prefill_s": prefill, "decode_s_per_token": decode}


def bench(lengths: list[int], methods: list[str], dtypes: list[str], new: int, threads: int, seed: int) -> dict:
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(seed)
    peak = matmul_peak()
    rows = []
    for dtype in dtypes:
        loaded = loading.load("smollm2", dtype)
        model, config = loaded.model, loaded.model.config
        ad = Adaptation(model)
        posenc_case(model, torch.randint(0, config.vocab_size, (1, 64), generator=gen), 1)  # warm-up, not timed
        for length in lengths:
            ids = torch.randint(0, config.vocab_size, (1, length), generator=gen)
            for spec in methods:
                ad.restore()
                if spec != "none":
                    ad.set_method(spec)
                case = posenc_case(model, ids, new)
                rows.append({"runtime": "posenc", "dtype": dtype, "method": spec, "length": length, **case})
                print(json.dumps(rows[-1]), flush=True)
        del model, loaded, ad
    gguf = Path(*loading._resolve("smollm2"))
    try:
        import llama_cpp
    except ImportError as exc:
        note = f"llama.cpp skipped: llama-cpp-python is not installed ({exc}); pip install 'posenc[llamacpp]'"
        return {"peak": peak, "rows": rows, "llamacpp": note, "flop_config": config.to_dict()}
    for length in lengths:
        ids = torch.randint(0, config.vocab_size, (length,), generator=gen).tolist()
        for flash in (False, True):
            case = llamacpp_case(gguf, ids, new, threads, flash)
            label = f"llama.cpp {llama_cpp.__version__}{' flash-attn' if flash else ''}"
            rows.append({"runtime": label, "dtype": "Q4_1", "method": "none", "length": length, **case})
            print(json.dumps(rows[-1]), flush=True)
    return {"peak": peak, "rows": rows, "llamacpp": None, "flop_config": config.to_dict()}


def markdown(res: dict, command: str) -> str:
    from transformers import LlamaConfig

    config = LlamaConfig(**res["flop_config"])
    peak = res["peak"]
    head = ["runtime", "weights", "method", "length", "prefill tok/s", "% of peak", "decode tok/s", "vs llama.cpp"]
    best_llama = {}
    for r in res["rows"]:
        if r["runtime"].startswith("llama.cpp"):
            best_llama[r["length"]] = max(best_llama.get(r["length"], 0.0), r["length"] / r["prefill_s"])
    cells = []
    for r in res["rows"]:
        tps = r["length"] / r["prefill_s"]
        ref = peak["bfloat16" if r["dtype"] == "bfloat16" else "float32"]
        pct = 100 * tps * flop_per_token(config, r["length"]) / (ref * 1e9)
        vs = f"{tps / best_llama[r['length']]:.2f}x" if r["length"] in best_llama else "n/a"
        cells.append(
            [
                r["runtime"],
                r["dtype"],
                r["method"],
                r["length"],
                f"{tps:,.0f}",
                f"{pct:.0f}%",
                f"{1 / r['decode_s_per_token']:,.1f}",
                vs,
            ]
        )
    lines = [
        "# SmolLM2-135M inference: posenc's transformers path beside llama.cpp",
        "",
        f"{res['cpu']}; bf16 units: {res['bf16_units']}; torch {res['torch']}; commit {res['commit']}; "
        f"{res['threads']} thread(s); load average {res['load_before']} before, {res['load_after']} after; "
        f"{res['new']} decode tokens per case; one run per case.",
        "",
        f"Command: `{command}`",
        "",
        f"Matmul peak (n = 1024, {res['threads']} thread(s)): float32 {peak['float32']:.0f} GFLOP/s, "
        f"bfloat16 {peak['bfloat16']:.0f} GFLOP/s.",
        "",
        markdown_table(head, cells),
        "",
        "prefill tok/s: L / seconds of the prefill forward (wall clock); % of peak: its FLOP/s (module docstring of "
        "`benchmarks/pretrained_prefill.py`) over the matmul peak of its dtype (llama.cpp's Q4_1: the float32 peak); "
        "vs llama.cpp: prefill tok/s over llama.cpp's best at the same length.",
        "",
    ]
    if res["llamacpp"]:
        lines += [res["llamacpp"], ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    p.add_argument("--methods", nargs="+", default=list(METHODS))
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    p.add_argument("--new", type=int, default=16, help="decode steps per case")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = p.parse_args(argv)
    before = loadavg()
    res = bench(args.lengths, args.methods, args.dtypes, args.new, args.threads, args.seed)
    res |= {
        "cpu": cpu_name(),
        "bf16_units": bf16_units(),
        "torch": torch.__version__,
        "commit": git_commit(),
        "threads": args.threads,
        "new": args.new,
        "load_before": before,
        "load_after": loadavg(),
    }
    command = "python benchmarks/pretrained_prefill.py " + " ".join(argv if argv is not None else sys.argv[1:])
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(args.out / "pretrained_prefill.json", json.dumps(res, indent=1).encode())
    atomic_write_bytes(args.out / "pretrained_prefill.md", markdown(res, command.strip()).encode())
    print(markdown(res, command.strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
