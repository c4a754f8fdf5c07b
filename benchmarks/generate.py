"""Decoding speed per scheme at long contexts, beside a Hugging Face Llama of the same size; decode-vs-parallel \
agreement.

    .venv/bin/python benchmarks/generate.py                                   # 1K/4K/16K, 32 new tokens, 1 thread
    .venv/bin/python benchmarks/generate.py --contexts 512 2048 --schemes rope path --new-tokens 16

For each context L, one interleaved round over the schemes (the default preset's plus
path) and ``transformers``' ``LlamaForCausalLM`` of the same size (the default
``compare`` model: 4 layers, width 256, 4 heads, vocabulary 256, tied embeddings; its
SwiGLU MLP of hidden 682 has the GELU MLP's 2 x 256 x 1024 weights; random weights:
speed does not depend on them): a prefill of L random tokens, then ``--new-tokens``
greedy one-token steps through the model's own cache (posenc ``LM.decode`` with
``Cache``, the incremental states; Llama with its ``DynamicCache``), timed without the
prefill. Reported: tokens/s and ms per new token at each L, the least-squares slope of
ms per token against L (ms per 1K tokens of context), the cache's bytes at the longest
L, and max |parallel - decoded| logits of a 2-layer model (64 tokens, float32 and
float64). Writes ``results/generate.{json,md}`` with the load average before and after.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import time
from pathlib import Path

import torch

from posenc.config.plan import load_preset
from posenc.model import Cache, build_model
from posenc.reports.render import markdown_table
from posenc.store.checkpoint import atomic_write_bytes
from posenc.store.stamp import cpu_name, git_commit

OUT = Path(__file__).resolve().parent / "results"
HF = "hf-llama"


def decode_error(scheme: str, dtype: torch.dtype, T: int = 64, prefill: int = 16) -> float:
    """max |parallel - decoded| logits of a 2-layer model on one random sequence of T tokens."""
    torch.manual_seed(0)
    model = (
        build_model({"encoding": scheme, "n_layer": 2, "n_head": 4, "d_model": 64, "train_length": 32}).to(dtype).eval()
    )
    x = torch.randint(0, 256, (1, T))
    cache = Cache(len(model.blocks))
    with torch.no_grad():
        steps = [model.decode(x[:, :prefill], cache)] + [
            model.decode(x[:, t : t + 1], cache) for t in range(prefill, T)
        ]
        return (torch.cat(steps, dim=1) - model(x)).abs().max().item()


def llama(cfg):
    """transformers' LlamaForCausalLM with the posenc model's sizes (SwiGLU hidden 2/3 of the GELU one: equal
    weights)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    hf = LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        num_hidden_layers=cfg.n_layer,
        num_attention_heads=cfg.n_head,
        num_key_value_heads=cfg.n_head,
        intermediate_size=2 * int(cfg.mlp_ratio * cfg.d_model) // 3,
        tie_word_embeddings=True,
        max_position_embeddings=1 << 20,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(hf).eval()


def hf_cache_bytes(cache) -> int:
    return sum(
        t.numel() * t.element_size()
        for layer in getattr(cache, "layers", [])
        for t in (layer.keys, layer.values)
        if t is not None
    )


@torch.no_grad()
def time_per_token(model, hf: bool, context: int, new: int) -> tuple[float, int]:
    """Seconds per greedy one-token step after a prefill of ``context`` random tokens, and the cache's bytes."""
    ids = torch.randint(0, 256, (1, context), generator=torch.Generator().manual_seed(context))
    if hf:
        out = model(input_ids=ids, use_cache=True)
        cache, logits = out.past_key_values, out.logits[:, -1]
    else:
        cache = Cache(len(model.blocks))
        logits = model.decode(ids, cache)[:, -1]
    t0 = time.perf_counter()
    for _ in range(new):
        token = logits.argmax(-1, keepdim=True)
        if hf:
            out = model(input_ids=token, past_key_values=cache, use_cache=True)
            cache, logits = out.past_key_values, out.logits[:, -1]
        else:
            logits = model.decode(token, cache)[:, -1]
    return (time.perf_counter() - t0) / new, hf_cache_bytes(cache) if hf else cache.nbytes()


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys against xs."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--schemes", nargs="+", help="default: the default preset's schemes and path")
    p.add_argument(
        "--contexts", nargs="+", type=int, default=[1024, 4096, 16384], help="prefill lengths (default 1K 4K 16K)"
    )
    p.add_argument("--new-tokens", type=int, default=32, help="timed one-token steps per context (default 32)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-hf", action="store_true", help="skip the transformers Llama")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    base = load_preset("default").model
    schemes = args.schemes or [*load_preset("default").schemes, "path"]
    models = {}
    for s in schemes:
        torch.manual_seed(0)
        models[s] = build_model(dataclasses.replace(base, encoding=s, train_length=128)).eval()
    if not args.no_hf:
        torch.manual_seed(0)
        models[HF] = llama(base)
    load_before = os.getloadavg()
    timing = {name: {} for name in models}
    for name, m in models.items():  # warm-up
        time_per_token(m, name == HF, 64, 2)
    for L in args.contexts:  # interleaved: every model at one context before the next context
        for name, m in models.items():
            sec, nbytes = time_per_token(m, name == HF, L, args.new_tokens)
            timing[name][L] = {"ms_per_token": 1e3 * sec, "tokens_per_s": 1 / sec, "cache_bytes": nbytes}
            print(json.dumps({"model": name, "context": L, **timing[name][L]}), flush=True)
    load_after = os.getloadavg()
    rows = []
    for name in models:
        t = timing[name]
        row = {
            "scheme": name,
            "by_context": t,
            "slope_ms_per_1k": 1e3 * slope(args.contexts, [t[L]["ms_per_token"] for L in args.contexts])
            if len(args.contexts) > 1
            else None,
        }
        if name != HF:
            row |= {
                "max_err_float32": decode_error(name, torch.float32),
                "max_err_float64": decode_error(name, torch.float64),
            }
        rows.append(row)
    meta = {
        "contexts": args.contexts,
        "new_tokens": args.new_tokens,
        "threads": torch.get_num_threads(),
        "load_average_before": load_before,
        "load_average_after": load_after,
        "machine": platform.processor() or platform.machine(),
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "commit": git_commit(),
        "torch": torch.__version__,
    }
    try:
        import transformers

        meta["transformers"] = transformers.__version__
    except ImportError:
        pass
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(args.out / "generate.json", json.dumps({"meta": meta, "rows": rows}, indent=1).encode())
    ref = {L: timing["rope"][L]["tokens_per_s"] for L in args.contexts} if "rope" in timing else None
    Lmax = args.contexts[-1]
    head = (
        ["scheme"]
        + [f"tok/s {L // 1024 if L >= 1024 else L}{'K' if L >= 1024 else ''}" for L in args.contexts]
        + [f"ms/token {L // 1024 if L >= 1024 else L}{'K' if L >= 1024 else ''}" for L in args.contexts]
        + ["slope ms per 1K ctx", f"x rope at {Lmax}", f"cache MiB at {Lmax}", "max err f32", "max err f64"]
    )
    table = []
    for r in rows:
        t = r["by_context"]
        table.append(
            [r["scheme"]]
            + [f"{t[L]['tokens_per_s']:.0f}" for L in args.contexts]
            + [f"{t[L]['ms_per_token']:.2f}" for L in args.contexts]
            + [
                f"{r['slope_ms_per_1k']:.3f}" if r["slope_ms_per_1k"] is not None else "",
                f"{t[Lmax]['tokens_per_s'] / ref[Lmax]:.2f}" if ref else "",
                f"{t[Lmax]['cache_bytes'] / 2**20:.1f}",
                f"{r['max_err_float32']:.1e}" if "max_err_float32" in r else "",
                f"{r['max_err_float64']:.1e}" if "max_err_float64" in r else "",
            ]
        )
    text = (
        "# Decoding speed at long contexts\n\n"
        "Default model (4 layers, width 256, 4 heads, vocabulary 256), batch 1, greedy; per context a prefill of "
        f"that many random tokens, then {args.new_tokens} timed one-token steps through the cache; "
        f"{meta['threads']} thread(s) on {meta['cpu']} ({meta['cores']} cores), commit {meta['commit']}, "
        f"torch {meta['torch']}"
        f"{', transformers ' + meta['transformers'] if 'transformers' in meta else ''}; one interleaved run; "
        f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after"
        + (  # a load beyond this run's own threads: something else ran on the cores
            " (above the thread count: other work shared the cores, absolute figures are noisy, ratios less so). "
            if max(load_before[0], load_after[0]) > meta["threads"] + 0.5
            else " (no other work on the cores). "
        )
        + f"`{HF}`: transformers' LlamaForCausalLM of the same size (SwiGLU hidden 682, as many MLP weights) "
        "with its own DynamicCache. "
        "Slope: least squares of ms per token against the context. "
        "Errors: max |parallel - decoded| logits (2-layer model, 64 tokens).\n\n"
        "Command: `.venv/bin/python benchmarks/generate.py "
        + " ".join(argv if argv is not None else __import__("sys").argv[1:])
        + "`\n\n"
    )
    atomic_write_bytes(args.out / "generate.md", (text + markdown_table(head, table) + "\n").encode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
