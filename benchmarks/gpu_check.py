"""One prepared GPU check (<= 5 minutes on one GPU): CUDA paths agree with CPU, and paper-scale throughput.

    python benchmarks/gpu_check.py                  # on a machine with a GPU; writes $OUT (or benchmarks/results)
    python benchmarks/gpu_check.py --device cpu --tiny   # a smoke run of the script itself, no GPU

Part 1, agreement (every scheme in ``posenc.encodings.names()``): one attention
layer and a small whole model, built once on CPU and copied to the device,
evaluated on the same small random inputs in eval mode (fixed random draws, so
CPU and CUDA see the same angles):
- float32 on the device (TF32 off) vs float32 on CPU: outputs, input and
  weight gradients (max abs difference; pass <= 1e-4 x scale);
- bf16 autocast on the device vs float32 on CPU: the model's mean NLL
  (pass: relative difference <= 2e-2) and that phases stay float32 under
  autocast.
Part 2, FlexAttention (the CUDA evaluation path of ALiBi and the forget gate)
against the chunked path: one attention call at T = 16384 and 65536.
Part 3, memory: peak device memory of scoring one 65,536-token window with the
``paper`` preset's model, per default scheme.
Part 4, throughput: the ``paper`` preset's model (16 x 768, vocab 32768, length
512) trained for a few steps per default scheme on random tokens (bf16 autocast,
AdamW, gradient clipping as ``posenc.train.loop``), eager (tokens/s and ratio to RoPE)
and under ``torch.compile``.

Exit status 1 when a CUDA path disagrees with the CPU path (part 1), else 0.

Results: ``gpu_check.json`` and ``gpu_check.md`` under ``$OUT`` when set (the
device tool's output folder), else ``benchmarks/results``. A time budget
(``--budget``, s) skips what no longer fits and says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

from posenc import encodings
from posenc.attention import attention
from posenc.config.plan import load_preset
from posenc.encodings.base import Inputs
from posenc.encodings.bias import alibi_slopes, distance_bias
from posenc.encodings.forget import forget_bias, log_forget_cumsum
from posenc.model import Attention, ModelConfig, build_model
from posenc.reports.render import markdown_table
from posenc.store.checkpoint import atomic_write_bytes
from posenc.train.optimizer import make_optimizer

PAPER = Path(__file__).resolve().parents[1] / "experiments" / "accumulated" / "presets" / "paper.yaml"
T0 = time.time()
FLEX_COLUMNS = ("alibi flex", "alibi chunked", "forget flex", "forget chunked")


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().float().cpu() - b.detach().float().cpu()).abs().max())


def layer_agreement(scheme: str, device: torch.device, T: int) -> dict:
    """float32 device vs CPU for one attention layer: output, input grad, weight grads."""
    depth = len(encodings.layer_pattern(scheme))  # a pattern needs its layers; layer 0 is checked
    cfg = ModelConfig(n_layer=depth, n_head=4, d_model=128, train_length=256, encoding=scheme)
    torch.manual_seed(0)
    cpu = Attention.from_config(cfg, 0).eval()
    dev = Attention.from_config(cfg, 0).eval()
    dev.load_state_dict(cpu.state_dict())
    dev.to(device)
    x = torch.randn(2, T, cfg.d_model)
    pos, tokens = torch.arange(T), torch.randint(0, cfg.vocab_size, (2, T))
    w = torch.randn(2, T, cfg.d_model)
    out = {}
    grads = []
    for layer, dv in ((cpu, torch.device("cpu")), (dev, device)):
        xi = x.to(dv).requires_grad_(True)
        y = layer(xi, pos.to(dv), tokens=tokens.to(dv))
        (y * w.to(dv)).sum().backward()
        grads.append((y, xi.grad, {n: p.grad for n, p in layer.named_parameters() if p.grad is not None}))
    (y0, gx0, gw0), (y1, gx1, gw1) = grads
    scale = float(y0.abs().max()) + 1e-12
    out["out"] = max_diff(y0, y1) / scale
    out["grad_x"] = max_diff(gx0, gx1) / (float(gx0.abs().max()) + 1e-12)
    out["grad_w"] = max((max_diff(gw0[n], gw1[n]) / (float(gw0[n].abs().max()) + 1e-12) for n in gw0), default=0.0)
    out["ok"] = max(out["out"], out["grad_x"], out["grad_w"]) <= 1e-4
    return out


def model_agreement(scheme: str, device: torch.device, T: int) -> dict:
    """Mean NLL of a small model: CPU float32 vs device float32 vs device bf16 autocast."""
    depth = max(2, len(encodings.layer_pattern(scheme)))  # every entry of a pattern
    cfg = ModelConfig(n_layer=depth, n_head=4, d_model=128, train_length=256, encoding=scheme)
    torch.manual_seed(0)
    cpu = build_model(cfg).eval()
    dev = build_model(cfg).eval()
    dev.load_state_dict(cpu.state_dict())
    dev.to(device)
    tok = torch.randint(0, cfg.vocab_size, (2, T + 1))
    with torch.no_grad():
        ref = float(cpu.token_nll(tok[:, :-1], tok[:, 1:]).mean())
        f32 = float(dev.token_nll(tok[:, :-1].to(device), tok[:, 1:].to(device)).mean())
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            bf16 = float(dev.token_nll(tok[:, :-1].to(device), tok[:, 1:].to(device)).mean())
            enc = dev.blocks[0].attn.enc
            xb = torch.randn(2, T, cfg.d_model, device=device).to(
                torch.bfloat16 if device.type == "cuda" else torch.float32
            )
            phi = enc.phases(Inputs(xb, torch.arange(T, device=device), tok[:, :-1].to(device)))
    rel32, rel16 = abs(f32 - ref) / ref, abs(bf16 - ref) / ref
    return {
        "nll_cpu": ref,
        "rel_f32": rel32,
        "rel_bf16": rel16,
        "phase_dtype": None if phi is None else str(phi.dtype).replace("torch.", ""),
        "ok": rel32 <= 1e-5 and rel16 <= 2e-2 and (phi is None or phi.dtype in (torch.float32, torch.float64)),
    }


def throughput(
    scheme: str, device: torch.device, cfg: ModelConfig, batch: int, steps: int, compiled: bool = False
) -> float:
    """Training tokens/s of ``cfg`` with ``scheme`` on random tokens (bf16 autocast on CUDA), eager or compiled."""
    preset = load_preset(str(PAPER))
    torch.manual_seed(0)
    model = build_model(dataclasses.replace(cfg, encoding=scheme)).to(device).train()
    opt = make_optimizer(model, preset.train)
    x, y = torch.randint(0, cfg.vocab_size, (2, batch, cfg.train_length), device=device)
    nll = torch.compile(model.token_nll) if compiled else model.token_nll

    def step(model=model, opt=opt):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = nll(x, y).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), preset.train.grad_clip)
        opt.step()

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(2):  # warm-up (kernel selection, Triton compilation for PaTH)
        step()
    sync()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    tps = steps * batch * cfg.train_length / (time.perf_counter() - t)
    del model, opt
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return tps


def eval_peak_memory(scheme: str, device: torch.device, cfg: ModelConfig, T: int) -> dict:
    """Peak device memory (GiB) and seconds of scoring one T-token window with the paper model (bf16 autocast)."""
    torch.manual_seed(0)
    model = build_model(dataclasses.replace(cfg, encoding=scheme)).to(device).eval()
    tok = torch.randint(0, cfg.vocab_size, (1, T + 1), device=device)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        nll = float(model.token_nll(tok[:, :-1], tok[:, 1:]).mean())
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"peak_gib": peak, "seconds": time.perf_counter() - t, "finite": math.isfinite(nll)}


def flex_vs_chunked(device: torch.device, T: int) -> dict:
    """Seconds of one causal attention (12 heads x 64, bf16 on CUDA) with an ALiBi and a forget-gate bias:
    FlexAttention (evaluation, no grad) against the chunked path (taken whenever grad is enabled)."""
    dt = torch.bfloat16 if device.type == "cuda" else torch.float32
    q, k, v = (torch.randn(1, 12, T, 64, device=device, dtype=dt) for _ in range(3))
    biases = {
        "alibi": distance_bias(alibi_slopes(12).to(device), torch.arange(T, device=device)),
        "forget": forget_bias(log_forget_cumsum(torch.randn(1, 12, T, device=device) + 3)),
    }
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    out = {}
    for name, bias in biases.items():
        for path, grad in (("flex", False), ("chunked", True)):
            with torch.set_grad_enabled(grad):
                attention(q, k, v, bias=bias)  # warm-up (compilation)
                sync()
                t = time.perf_counter()
                attention(q, k, v, bias=bias)
                sync()
            out[f"{name} {path}"] = time.perf_counter() - t
    return out


def fla_available() -> bool:
    from posenc.encodings.householder import _fla_kernel

    return _fla_kernel() is not None


def _tps(v) -> str:
    """A tokens/s cell: the number, or the reason there is none."""
    return v if isinstance(v, str) else f"{v:,.0f}"


def markdown(res: dict) -> str:
    lines = [
        f"# GPU check on {res['device_name']}",
        "",
        f"torch {res['torch']}, flash-linear-attention kernel: {res['fla']}, {res['seconds']:.0f} s.",
        "",
        "## CUDA vs CPU (small inputs, eval mode)",
        "",
    ]
    rows = []
    for s, r in res["agreement"].items():
        if "error" in r:
            rows.append([s, f"error: {r['error']}", "", "", "", "", "", "no"])
            continue
        la, ma = r["layer"], r["model"]
        rows.append(
            [
                s,
                f"{la['out']:.1e}",
                f"{la['grad_x']:.1e}",
                f"{la['grad_w']:.1e}",
                f"{ma['rel_f32']:.1e}",
                f"{ma['rel_bf16']:.1e}",
                ma["phase_dtype"],
                "yes" if la["ok"] and ma["ok"] else "NO",
            ]
        )
    lines.append(
        markdown_table(
            [
                "scheme",
                "layer out",
                "grad x",
                "grad W",
                "model NLL f32",
                "model NLL bf16",
                "phases under autocast",
                "ok",
            ],
            rows,
        )
    )
    t = res["throughput"]
    base = t["tokens_per_s"].get("rope")
    rows = [
        [
            s,
            _tps(v),
            "" if isinstance(v, str) or not base else f"{v / base:.2f}x",
            _tps(t["compiled"].get(s, "not run")),
        ]
        for s, v in t["tokens_per_s"].items()
    ]
    lines += [
        "",
        f"## Paper-preset training throughput ({t['config']})",
        "",
        markdown_table(["scheme", "tokens/s eager", "ratio to RoPE", "tokens/s compiled"], rows),
    ]
    lines += [
        "",
        f"## Scoring one {res['memory_length']}-token window with the paper model (bf16 autocast)",
        "",
        markdown_table(
            ["scheme", "peak memory (GiB)", "seconds"],
            [
                [s, m, ""] if isinstance(m, str) else [s, f"{m['peak_gib']:.2f}", f"{m['seconds']:.1f}"]
                for s, m in res["memory"].items()
            ],
        ),
    ]
    lines += [
        "",
        "## FlexAttention vs the chunked path (one attention call, 12 heads x 64)",
        "",
        markdown_table(
            ["T", *FLEX_COLUMNS],
            [
                [T, *(f"{r[c] * 1e3:.1f} ms" for c in FLEX_COLUMNS)] if isinstance(r, dict) else [T, r]
                for T, r in res["flex"].items()
            ],
        ),
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="tiny throughput model (smoke run of the script)")
    p.add_argument("--budget", type=float, default=270, help="seconds; later work is skipped and reported")
    p.add_argument("--steps", type=int, default=8, help="timed steps per scheme")
    p.add_argument("--batch", type=int, default=16, help="sequences of 512 tokens per step")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print("gpu_check: no CUDA device", file=sys.stderr)
            return 2
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 comparisons in true float32
        torch.backends.cudnn.allow_tf32 = False
    schemes = ["rope"] + [s for s in encodings.names() if s != "rope"]
    res = {
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "fla": fla_available(),
        "agreement": {},
    }
    for s in schemes:
        try:
            res["agreement"][s] = {
                "layer": layer_agreement(s, device, T=192),
                "model": model_agreement(s, device, T=192),
            }
        except Exception as exc:  # reported; the other schemes go on
            res["agreement"][s] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
        print(f"[{time.time() - T0:5.0f} s] agreement {s}: {res['agreement'][s]}", flush=True)
    cfg = dataclasses.replace(load_preset(str(PAPER)).model, vocab_size=32768)
    if args.tiny:
        cfg = dataclasses.replace(cfg, n_layer=2, d_model=96, n_head=2, train_length=64, vocab_size=512)
    batch, default = 2 if args.tiny else args.batch, load_preset("default").schemes
    deadline = T0 + args.budget
    res["flex"] = {
        T: guarded(lambda T=T: flex_vs_chunked(device, T), deadline)
        for T in ((512, 1024) if args.tiny else (16384, 65536))
    }
    res["memory_length"] = 1024 if args.tiny else 65536
    res["memory"] = {
        s: guarded(lambda s=s: eval_peak_memory(s, device, cfg, res["memory_length"]), deadline) for s in default
    }
    res["throughput"] = {
        "config": f"{cfg.n_layer} layers, width {cfg.d_model}, vocab {cfg.vocab_size}, "
        f"{batch} x {cfg.train_length} tokens/step, "
        f"{'bf16 autocast' if device.type == 'cuda' else 'float32'}, {args.steps} timed steps after 2 warm-up",
        "tokens_per_s": {},
        "compiled": {},
    }
    for key, compiled in (("tokens_per_s", False), ("compiled", True)):
        for s in default[:1] if compiled and args.tiny else default:  # --tiny: one compiled scheme (a smoke run)
            res["throughput"][key][s] = guarded(
                lambda s=s, compiled=compiled: throughput(s, device, cfg, batch, args.steps, compiled), deadline
            )
            print(f"[{time.time() - T0:5.0f} s] throughput {key} {s}: {res['throughput'][key][s]}", flush=True)
    res["seconds"] = time.time() - T0
    out = Path(os.environ.get("OUT") or Path(__file__).resolve().parent / "results")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / "gpu_check.json", (json.dumps(res, indent=2) + "\n").encode())
    atomic_write_bytes(out / "gpu_check.md", markdown(res).encode())
    print(markdown(res))
    failed = [s for s, r in res["agreement"].items() if "error" in r or not (r["layer"]["ok"] and r["model"]["ok"])]
    if failed:
        print(f"gpu_check: CUDA disagrees with CPU for {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def guarded(work, deadline: float):
    """``work()``, or a string saying why not: skipped past ``deadline`` (time.time()), or its error (the others go
    on)."""
    if time.time() > deadline:
        return "skipped (time budget)"
    try:
        return work()
    except Exception as exc:
        return f"error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


if __name__ == "__main__":
    sys.exit(main())
