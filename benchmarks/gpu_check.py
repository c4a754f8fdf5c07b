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
Part 2, throughput: the ``paper`` preset's model (16 x 768, vocab 32768, length
512) trained for a few steps per scheme on random tokens (bf16 autocast, AdamW,
gradient clipping as ``posenc.train``), tokens/s as a ratio to RoPE.

Results: ``gpu_check.json`` and ``gpu_check.md`` under ``$OUT`` when set (the
device tool's output folder), else ``benchmarks/results``. A time budget
(``--budget``, s) skips what no longer fits and says so.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from posenc import encodings
from posenc.checkpoint import atomic_write_bytes
from posenc.config import load_preset
from posenc.encodings.base import Inputs
from posenc.model import Attention, ModelConfig, build_model
from posenc.reporting import markdown_table
from posenc.train import make_optimizer

T0 = time.time()


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().float().cpu() - b.detach().float().cpu()).abs().max())


def layer_agreement(scheme: str, device: torch.device, T: int) -> dict:
    """float32 device vs CPU for one attention layer: output, input grad, weight grads."""
    cfg = ModelConfig(n_layer=1, n_head=4, d_model=128, train_length=256, encoding=scheme)
    torch.manual_seed(0)
    cpu = Attention(cfg, 0).eval()
    dev = Attention(cfg, 0).eval()
    dev.load_state_dict(cpu.state_dict())
    dev.to(device)
    x = torch.randn(2, T, cfg.d_model)
    pos, tokens = torch.arange(T), torch.randint(0, cfg.vocab_size, (2, T))
    w = torch.randn(2, T, cfg.d_model)
    out = {}
    grads = []
    for layer, dv in ((cpu, torch.device("cpu")), (dev, device)):
        xi = x.to(dv).requires_grad_(True)
        y = layer(xi, pos.to(dv), tokens.to(dv))
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
    cfg = ModelConfig(n_layer=2, n_head=4, d_model=128, train_length=256, encoding=scheme)
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
            xb = torch.randn(2, T, cfg.d_model, device=device).to(torch.bfloat16 if device.type == "cuda" else torch.float32)
            phi = enc.phases(Inputs(xb, torch.arange(T, device=device), tok[:, :-1].to(device)))
    rel32, rel16 = abs(f32 - ref) / ref, abs(bf16 - ref) / ref
    return {
        "nll_cpu": ref, "rel_f32": rel32, "rel_bf16": rel16,
        "phase_dtype": None if phi is None else str(phi.dtype).replace("torch.", ""),
        "ok": rel32 <= 1e-5 and rel16 <= 2e-2 and (phi is None or phi.dtype in (torch.float32, torch.float64)),
    }


def throughput(scheme: str, device: torch.device, cfg: ModelConfig, batch: int, steps: int) -> float:
    """Training tokens/s of ``cfg`` with ``scheme`` on random tokens (bf16 autocast on CUDA)."""
    preset = load_preset("paper")
    torch.manual_seed(0)
    model = build_model(cfg.model_copy(update={"encoding": scheme})).to(device).train()
    opt = make_optimizer(model, preset.train)
    x, y = torch.randint(0, cfg.vocab_size, (2, batch, cfg.train_length), device=device)

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = model.token_nll(x, y).mean()
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


def fla_available() -> bool:
    from posenc.encodings.householder import _fla_kernel

    return _fla_kernel() is not None


def markdown(res: dict) -> str:
    lines = [f"# GPU check on {res['device_name']}", "", f"torch {res['torch']}, flash-linear-attention kernel: "
             f"{res['fla']}, {res['seconds']:.0f} s.", "", "## CUDA vs CPU (small inputs, eval mode)", ""]
    rows = []
    for s, r in res["agreement"].items():
        if "error" in r:
            rows.append([s, f"error: {r['error']}", "", "", "", "", "", "no"])
            continue
        la, ma = r["layer"], r["model"]
        rows.append([s, f"{la['out']:.1e}", f"{la['grad_x']:.1e}", f"{la['grad_w']:.1e}", f"{ma['rel_f32']:.1e}",
                     f"{ma['rel_bf16']:.1e}", ma["phase_dtype"], "yes" if la["ok"] and ma["ok"] else "NO"])
    lines.append(markdown_table(["scheme", "layer out", "grad x", "grad W", "model NLL f32", "model NLL bf16",
                                 "phases under autocast", "ok"], rows))
    t = res["throughput"]
    base = t["tokens_per_s"].get("rope")
    rows = [[s, v, ""] if isinstance(v, str) else [s, f"{v:,.0f}", f"{v / base:.2f}x" if base else ""]
            for s, v in t["tokens_per_s"].items()]
    lines += ["", f"## Paper-preset training throughput ({t['config']})", "",
              markdown_table(["scheme", "tokens/s", "ratio to RoPE"], rows)]
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
    res = {"device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "torch": torch.__version__,
           "fla": fla_available(), "agreement": {}}
    for s in schemes:
        try:
            res["agreement"][s] = {"layer": layer_agreement(s, device, T=192), "model": model_agreement(s, device, T=192)}
        except Exception as exc:  # reported; the other schemes go on
            res["agreement"][s] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
        print(f"[{time.time() - T0:5.0f} s] agreement {s}: {res['agreement'][s]}", flush=True)
    cfg = load_preset("paper").model.model_copy(update={"vocab_size": 32768})
    if args.tiny:
        cfg = cfg.model_copy(update={"n_layer": 2, "d_model": 96, "n_head": 2, "train_length": 64, "vocab_size": 512})
    batch = 2 if args.tiny else args.batch
    res["throughput"] = {"config": f"{cfg.n_layer} layers, width {cfg.d_model}, vocab {cfg.vocab_size}, {batch} x {cfg.train_length} tokens/step, "
                                   f"{'bf16 autocast' if device.type == 'cuda' else 'float32'}, {args.steps} timed steps after 2 warm-up",
                         "tokens_per_s": {}}
    for s in schemes:
        if time.time() - T0 > args.budget:
            res["throughput"]["tokens_per_s"][s] = "skipped (time budget)"
            continue
        try:
            res["throughput"]["tokens_per_s"][s] = throughput(s, device, cfg, batch, args.steps)
        except Exception as exc:
            res["throughput"]["tokens_per_s"][s] = f"error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        print(f"[{time.time() - T0:5.0f} s] throughput {s}: {res['throughput']['tokens_per_s'][s]}", flush=True)
    res["seconds"] = time.time() - T0
    out = Path(os.environ.get("OUT") or Path(__file__).resolve().parent / "results")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / "gpu_check.json", (json.dumps(res, indent=2) + "\n").encode())
    atomic_write_bytes(out / "gpu_check.md", markdown(res).encode())
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
