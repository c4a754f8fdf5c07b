"""Attention diagnostics of a trained model: why a scheme extrapolates or fails.

The quantities of the stylized model (arXiv 2606.24975, Sec. 3-4)
measured inside a trained posenc model, per layer and head, against evaluation length:

- far attention mass: for query i, the softmax mass on keys at distance i - j >= w
  (w = the training length by default), averaged over the queries that have such
  keys (i >= w). With bounded logits the paper's bound rho_D >= M / (M + K e^(2 lambda))
  (M far, K near keys) drives it towards 1 as the context grows for rotation-only
  schemes; a distance bias (ALiBi, Press et al. 2022) keeps it near 0.
- attention entropy: -sum_j p_ij log p_ij (nats), averaged over all queries;
  uniform causal attention gives log(i + 1).
- spectral gap of the step angles (accumulated rotations; any scheme with phases):
  per head and frequency block b, beta_b = |mean_t exp(i theta_tb)| over held-out
  tokens, with theta_t = Phi_t - Phi_{t-1} read back from the phases (exact mod
  2 pi), and the mean step arg mean exp(i theta). The baseline is the scheme's
  uniform step law, beta_b = |sin a_b / a_b|; RoPE has constant steps, beta = 1.

Memory is bounded as in evaluation: per layer, the captured q, k (rotated by the
scheme's phases) and bias tiles are reduced one query block at a time, so at most
(block x T) probabilities exist; ``naive_layer_sums`` (the full T x T matrix) is
the reference. Schemes whose attention is a custom ``attend`` are read through their
``logits`` hook (CoPE, DAPE); those without one (PaTH, xPos, PoPE, ReRoPE) have no
softmax to read and are reported as not supported.

This module measures (typed records, ``posenc.store.records.Diagnosis``); ``posenc.reports.diagnose`` writes the
tables, the records file and the plots.
"""

from __future__ import annotations

import math
from typing import Annotated

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator
from tqdm.auto import tqdm

from posenc.attention import causal_tile, rotate
from posenc.encodings.absolute import LengthNotSupported
from posenc.encodings.base import Encoding
from posenc.errors import PosencError
from posenc.layer import bound_window
from posenc.model import LM, AttentionInputs
from posenc.scoring import eval_lengths, window_starts
from posenc.store.presets import CountOrOff, distinct
from posenc.store.records import Diagnosis, FarMass, LayerGap, LengthDiagnosis

BLOCK_ELEMS = 2**23  # probabilities held at once per query block (32 MiB in float32)
DEFAULT_MULTIPLES = (1, 2, 4, 8, 16, 32, 64)
# float32 phases (error <= 2.4e-7 rad) put constant steps at 1 - beta ~ 1e-13; closer to 1 counts as 1
BETA_ONE = 1e-9


class FarMassConfig(BaseModel):
    """The cheap diagnose pass of ``compare``: far mass and entropy at a few lengths."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    multiples: list[Annotated[int, Field(gt=0)]] = [2, 16]
    """Lengths diagnosed, as multiples of the training length (each once)."""
    _distinct = field_validator("multiples")(distinct)
    windows: CountOrOff = 1
    """Held-out windows per length; 0 switches the pass off."""


# ---------------------------------------------------------------- per-layer reductions


def rotated_qk(a: AttentionInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k as the attention core scores them (rotated by the phases): (B, H, T, D) float32."""
    q, k = a.q.float(), a.k.float()
    if a.phases is not None:
        q, k = rotate(q, a.phases, a.pairing), rotate(k, a.phases, a.pairing)
    return q, k


def block_logits(a: AttentionInputs, q: torch.Tensor, k: torch.Tensor, qs: int, qe: int) -> torch.Tensor:
    """Causal logits of queries [qs, qe) over keys [0, qe): (B, H, qe-qs, qe) float32, -inf above the diagonal.

    Logits are ``logit_scale * q.k / sqrt(D) + bias`` as in ``posenc.attention.attention``;
    q, k from ``rotated_qk``; -inf too outside a windowed layer's window (``Encoding.window``).
    """
    scale = a.logit_scale / math.sqrt(q.shape[-1])
    scores = scale * (q[..., qs:qe, :] @ k[..., :qe, :].transpose(-1, -2))
    scores = scores + causal_tile(a.bias, qs, qe, qe, q.device, torch.float32)
    window = bound_window(a.encoding.window, 0, a.inp.first)
    return scores if window is None else scores.masked_fill(~window.keep(qs, qe, 0, qe, q.device), float("-inf"))


def _reduce(logits: torch.Tensor, qs: int, w: int) -> dict[str, torch.Tensor]:
    """Per-head sums over the block's queries, float64 (H,): far mass, entropy and the far-mass bound.

    Far keys are at distance i - j >= w. The bound (arXiv 2606.24975, Sec. 4) for a
    row with M = i - w + 1 far and K = w near keys and logits spanning a range r
    (= 2 lambda) is M / (M + K e^r) = sigmoid(log(M / K) - r); 0 for rows without far keys.
    """
    p = torch.softmax(logits, dim=-1)
    i = torch.arange(qs, qs + p.shape[-2], device=p.device)
    far_keys = (i[:, None] - torch.arange(p.shape[-1], device=p.device)[None, :]) >= w
    r = (logits.amax(-1) - logits.masked_fill(torch.isinf(logits), float("inf")).amin(-1)).double()
    M = (i - w + 1).clamp(min=0).double()
    bound = torch.where(M > 0, torch.sigmoid(torch.log(M / w) - r), torch.zeros_like(r))
    return {
        "far": (p * far_keys).sum(-1).double().sum((0, 2)),
        "entropy": -torch.special.xlogy(p, p).sum(-1).double().sum((0, 2)),
        "bound": bound.sum((0, 2)),
    }


@torch.inference_mode()
def layer_sums(
    a: AttentionInputs, w: int, block_elems: int = BLOCK_ELEMS, enc: Encoding | None = None
) -> dict[str, torch.Tensor]:
    """Streaming sums over one layer's queries, per head: ``far``, ``entropy``, ``bound`` (H,) float64.

    Divide ``far`` and ``bound`` by the number of queries with far keys
    (B * max(0, T - w)) and ``entropy`` by B * T for means. Query blocks hold at
    most ``block_elems`` logits (at least one query row). ``enc``: the layer's scheme,
    whose own ``logits`` are read when it replaces attention (CoPE, DAPE).
    """
    q, k = rotated_qk(a)
    B, H, T, _ = q.shape
    qb = max(1, min(T, block_elems // (B * H * T)))

    def logits(qs: int, qe: int) -> torch.Tensor:
        if enc is not None and enc.replaces_attention:
            return enc.logits(a.q, a.k, a.inp, a.bias, qs, qe).float()
        return block_logits(a, q, k, qs, qe)

    sums = [_reduce(logits(qs, min(qs + qb, T)), qs, w) for qs in range(0, T, qb)]
    return {key: sum(s[key] for s in sums).cpu() for key in sums[0]}


def naive_layer_sums(a: AttentionInputs, w: int) -> dict[str, torch.Tensor]:
    """Reference for ``layer_sums``: the full (T x T) matrix in one piece."""
    q, k = rotated_qk(a)
    return {key: v.cpu() for key, v in _reduce(block_logits(a, q, k, 0, q.shape[-2]), 0, w).items()}


def uniform_reference(length: int, w: int) -> tuple[float | None, float]:
    """(far mass, entropy) of uniform causal attention: means of (i-w+1)/(i+1) over i >= w and of log(i+1)."""
    i = np.arange(length, dtype=np.float64)
    far = ((i[w:] - w + 1) / (i[w:] + 1)).mean() if length > w else None
    return (None if far is None else float(far)), float(np.log1p(i).mean())


def step_phasor_sums(phases: torch.Tensor, n_head: int) -> tuple[torch.Tensor, int]:
    """Sum of exp(i theta_t) over steps t >= 1, theta_t = Phi_t - Phi_{t-1}: complex128 (H, D/2), and the count.

    phases: (B|1, H|1, T, D/2) radians. The difference is exact mod 2 pi, which is all
    exp(i theta) sees.
    """
    phi = phases.double()
    theta = phi[..., 1:, :] - phi[..., :-1, :]
    z = torch.polar(torch.ones_like(theta), theta).sum((0, 2))  # (H|1, D/2)
    return z.expand(n_head, -1).cpu(), phi.shape[0] * theta.shape[-2]


# ---------------------------------------------------------------- whole model


def unreadable(model: LM) -> bool:
    """True when some layer's scheme replaces attention without exposing its logits: no softmax to read."""
    return any(b.attn.enc.replaces_attention and not b.attn.enc.has_logits for b in model.blocks)


def baseline_gap(enc: Encoding) -> list[float] | None:
    """The scheme's step-law spectral gap per block, (D/2,): uniform steps |sin a_b / a_b|; RoPE 1."""
    gap = enc.spectral_gap()
    return None if gap is None else gap.tolist()


@torch.inference_mode()
def diagnose_model(
    model: LM,
    docs: list[tuple[str, np.ndarray]],
    multiples=DEFAULT_MULTIPLES,
    w: int | None = None,
    n_windows: int = 2,
    block_elems: int = BLOCK_ELEMS,
    progress: bool = True,
) -> Diagnosis:
    """Far mass, entropy and step spectral gaps of ``model`` on held-out windows.

    docs: held-out (name, tokens) documents; lengths are ``multiples`` of the
    training length, ``n_windows`` windows each (``posenc.scoring.window_starts``).
    Returns the record: ``lengths`` (a ``LengthDiagnosis`` per length: per-layer, per-head
    far mass and entropy, their means and the uniform reference), ``spectral_gap``
    (a ``LayerGap`` per layer with phases: beta (H, D/2), baseline (D/2,), mean step (H, D/2)) or None,
    and ``note`` when the scheme is not supported; ``progress``: a bar of windows on stderr when stderr is a
    terminal (never in a log file). Raises PosencError for
    impossible lengths, or a ``w`` no evaluation length reaches.
    """
    model.eval()
    cfg = model.cfg
    lengths = eval_lengths(cfg.train_length, multiples)
    if w is not None and lengths and w >= max(lengths):  # no query has keys that far: every far mass n/a
        raise PosencError(f"far-mass distance w={w} must be < the longest evaluation length {max(lengths)}")
    w = cfg.train_length if w is None else w
    if w < 1 or n_windows < 1:
        raise PosencError(f"need a far-mass distance w >= 1 and >= 1 window per length, got w={w}, windows={n_windows}")
    out = Diagnosis(
        scheme=cfg.encoding,
        describe=(model.pos_embed or model.blocks[0].attn.enc).describe(),
        train_length=cfg.train_length,
        w=w,
        windows_per_length=n_windows,
    )
    if unreadable(model):
        out.note = (
            f"not supported: {cfg.encoding} replaces attention without exposing its logits, "
            "so there is no softmax to read"
        )
        return out
    phasors = [0] * cfg.n_layer  # per layer: sum of exp(i theta), (H, P) complex128 once the layer has phases
    steps = [0] * cfg.n_layer
    plan = [(L, window_starts(docs, L, n_windows * L)) for L in lengths]
    bar = tqdm(
        total=sum(len(ws) for _, ws in plan),
        desc="diagnose",
        unit="win",
        leave=False,
        disable=None if progress else True,
    )
    out.lengths = [_length_record(model, docs, L, wins, w, block_elems, phasors, steps, bar) for L, wins in plan]
    bar.close()
    if any(steps):
        out.spectral_gap = _spectral_gaps(model, phasors, steps)
    return out


def _length_record(
    model: LM, docs, L: int, wins: list[tuple[int, int]], w: int, block_elems: int, phasors: list, steps: list, bar
) -> LengthDiagnosis:
    """One length's entry of ``diagnose_model``: far mass, its bound and entropy per layer and head over the windows
    ``wins`` (doc, start), their means and the uniform reference; a note when the scheme cannot run that length.
    Each layer's step phasors (``step_phasor_sums``) are added to ``phasors[layer]`` / ``steps[layer]``."""
    cfg, device = model.cfg, next(model.parameters()).device
    H, L_n = cfg.n_head, cfg.n_layer
    far, ent, bound = (torch.zeros(L_n, H, dtype=torch.float64) for _ in range(3))
    where = {"length": L, "multiple": L / cfg.train_length}
    try:
        for d, s in wins:
            tokens = torch.from_numpy(docs[d][1][s : s + L].astype(np.int64))[None].to(device)
            for layer, a in enumerate(model.prepare(tokens)):
                sums = layer_sums(a, w, block_elems, model.blocks[layer].attn.enc)
                far[layer] += sums["far"]
                ent[layer] += sums["entropy"]
                bound[layer] += sums["bound"]
                if a.phases is not None:
                    z, n = step_phasor_sums(a.phases, H)
                    phasors[layer] += z
                    steps[layer] += n
            bar.update(1)
    except LengthNotSupported as exc:
        return LengthDiagnosis(**where, windows=0, note=f"n/a: {exc}")
    n_far = len(wins) * max(0, L - w)
    u_far, u_ent = uniform_reference(L, w)
    return LengthDiagnosis(
        **where,
        windows=len(wins),
        far_mass=(far / n_far).tolist() if n_far else None,
        far_mass_bound=(bound / n_far).tolist() if n_far else None,
        entropy=(ent / (len(wins) * L)).tolist(),
        far_mass_mean=float(far.sum() / (n_far * L_n * H)) if n_far else None,
        entropy_mean=float(ent.mean() / (len(wins) * L)),
        uniform_far_mass=u_far,
        uniform_entropy=u_ent,
    )


def _spectral_gaps(model: LM, phasors: list, steps: list) -> list[LayerGap]:
    """Per layer with phases: beta (H, D/2) = |mean exp(i theta)| (1 within ``BETA_ONE``), the step-law baseline
    and the mean step arg mean exp(i theta) (rad/token)."""
    out = []
    for layer in (i for i in range(len(steps)) if steps[i]):  # rotary layers (a '|' pattern may mix in others)
        base = baseline_gap(model.blocks[layer].attn.enc)
        beta = phasors[layer].abs() / max(1, steps[layer])
        beta = torch.where(1 - beta < BETA_ONE, torch.ones_like(beta), beta)
        drift = torch.angle(phasors[layer])  # arg mean exp(i theta): the steps' mean rotation per token
        out.append(
            LayerGap(
                layer=layer,
                steps=steps[layer],
                beta=beta.tolist(),
                baseline=base,
                mean_step=drift.tolist(),
            )
        )
    return out


def far_mass_records(model: LM, docs, settings: FarMassConfig, base: dict) -> list[FarMass]:
    """The cheap pass of ``compare``: one record per length, far mass and entropy means over layers and heads.

    base: {"scheme", "seed", "train_length"} of the compare job, copied into each record.
    """
    if not settings.windows or not settings.multiples:
        return []
    res = diagnose_model(model, docs, settings.multiples, n_windows=settings.windows, progress=False)
    if res.note:
        return [
            FarMass(**base, length=L, note=res.note) for L in eval_lengths(model.cfg.train_length, settings.multiples)
        ]
    keep = {"length", "windows", "far_mass_mean", "entropy_mean", "uniform_far_mass", "uniform_entropy", "note"}
    return [FarMass(**base, **r.model_dump(include=keep), w=res.w) for r in res.lengths]
