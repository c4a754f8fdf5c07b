"""Why a forget-gate model loses flip-flop reads past a gap: the read's attention onto the write, and the gate's leak.

For controlled-gap probes (a training-length prefix, a write, g ignores, a read) prints, per layer and head,
the attention mass of the read on the write (its W and bit tokens), the logit margin of the write's bit over
the best other key, the accuracy of the read, and the mean log forget-gate per token over the gap.

    .venv/bin/python experiments/accumulated/forget_gap.py runs/retrieval/flipflop/forget/seed0 \
        > results/retrieval/forget_gap.txt

The leak over the gap is library code now (``posenc.eval.tasks.gate_leak``, every head of every gated layer, ignores
and bits together): each task job records it (``Task.leak``) and claim R8 reads it.
"""

import sys

import numpy as np
import torch

from posenc.data.tasks import get_task
from posenc.encodings.forget import log_gates
from posenc.eval.diagnose import block_logits, rotated_qk
from posenc.train.rundir import load_run

torch.set_num_threads(1)
model, mcfg, _ = load_run(sys.argv[1])
model.eval()
task, L0 = get_task("flipflop"), mcfg.train_length


def probes(gap: int, n: int) -> torch.Tensor:
    rng = np.random.default_rng(0)
    return torch.tensor(np.stack([task.row(rng, L0 + gap + 1, gap=gap)[0] for _ in range(n)]))


print(f"{sys.argv[1]}: 16 probes per gap; per layer, per head")
with torch.no_grad():
    for g in (64, 256, 1024, 2048, 4096):
        tok = probes(g, 16)
        x, y = tok[:, :-1], tok[:, 1:]
        T = x.shape[1]
        read, bit = T - 1, T - 1 - g  # the read instruction's query; the write's bit token
        acc = (model(x)[:, -1].argmax(-1) == y[:, -1]).float().mean().item()
        parts = []
        for li, a in enumerate(model.prepare(x)):
            q, k = rotated_qk(a)
            lg = block_logits(a, q, k, read, read + 1)[:, :, 0, :]  # (B, H, T)
            mass = torch.softmax(lg, -1)[..., bit - 1 : bit + 1].sum(-1).mean(0)
            others = lg.clone()
            others[..., bit - 1 : bit + 1] = -float("inf")
            margin = (lg[..., bit] - others.amax(-1)).mean(0)
            parts.append(
                f"layer {li}: mass on the write {', '.join(f'{m:.3f}' for m in mass.tolist())}, "
                f"margin {', '.join(f'{m:.1f}' for m in margin.tolist())}"
            )
        print(f"gap {g}: read accuracy {acc:.2f}; " + "; ".join(parts))
    tok = probes(4096, 4)[:, :-1]
    for li, a in enumerate(model.prepare(tok)):
        lf = log_gates(a.encoding.gate(a.inp.x).transpose(1, 2))[..., -4096:-2]  # over the gap
        print(
            f"layer {li}: mean log f per token on the gap's ignores "
            f"{', '.join(f'{v:.4f}' for v in lf[..., 0::2].mean((0, 2)).tolist())}"
            f", on their bits {', '.join(f'{v:.4f}' for v in lf[..., 1::2].mean((0, 2)).tolist())}"
        )
