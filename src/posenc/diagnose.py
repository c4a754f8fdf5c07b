"""Attention diagnostics of a trained model: why a scheme extrapolates or fails.

The quantities of the stylized model (arXiv 2606.24975, Sec. 3-4; ``posenc.theory``)
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
  2 pi), and the mixing window w_eps = ceil(log eps / log beta) (Theorem 1). The
  baseline is the scheme's uniform step law, beta_b = |sin a_b / a_b|; RoPE has
  constant steps, beta = 1 and no window.

Memory is bounded as in evaluation: per layer, the captured q, k (rotated by the
scheme's phases) and bias tiles are reduced one query block at a time, so at most
(block x T) probabilities exist; ``naive_layer_sums`` (the full T x T matrix) is
the reference. Schemes whose attention is a custom ``attend`` are read through their
``logits`` hook (CoPE, DAPE); those without one (PaTH, xPos, PoPE, ReRoPE) have no
softmax to read and are reported as not supported.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from tqdm.auto import tqdm

from posenc.attention import causal_tile, rotate
from posenc.checkpoint import atomic_write_bytes, write_json
from posenc.encodings.absolute import LengthNotSupported
from posenc.encodings.base import Encoding
from posenc.errors import PosencError
from posenc.evaluate import eval_lengths, window_starts
from posenc.model import LM, AttentionInputs
from posenc.passkey import passkey_records
from posenc.records import FarMass, PasskeyCell, append, load
from posenc.reporting import figure, log_scale, markdown_table, save_figure
from posenc.encodings.mixing import check_eps, window_size

BLOCK_ELEMS = 2**23  # probabilities held at once per query block (32 MiB in float32)
DEFAULT_MULTIPLES = (1, 2, 4, 8, 16, 32, 64)
# float32 phases (error <= 2.4e-7 rad) put constant steps at 1 - beta ~ 1e-13; closer to 1 counts as 1
BETA_ONE = 1e-9


class FarMassConfig(BaseModel):
    """The cheap diagnose pass of ``compare``: far mass and entropy at a few lengths."""

    model_config = ConfigDict(extra="forbid")

    multiples: list[int] = [2, 16]
    windows: int = Field(1, ge=0)  # per length; 0 switches the pass off


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
    q, k from ``rotated_qk``.
    """
    scale = a.logit_scale / math.sqrt(q.shape[-1])
    scores = scale * (q[..., qs:qe, :] @ k[..., :qe, :].transpose(-1, -2))
    return scores + causal_tile(a.bias, qs, qe, qe, q.device, torch.float32)


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
def layer_sums(a: AttentionInputs, w: int, block_elems: int = BLOCK_ELEMS, enc: Optional[Encoding] = None) -> dict[str, torch.Tensor]:
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


def uniform_reference(length: int, w: int) -> tuple[Optional[float], float]:
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


def baseline_gap(enc: Encoding) -> Optional[list[float]]:
    """The scheme's step-law spectral gap per block, (D/2,): uniform steps |sin a_b / a_b|; RoPE 1."""
    gap = enc.spectral_gap()
    return None if gap is None else gap.tolist()


@torch.inference_mode()
def diagnose_model(
    model: LM,
    docs: list[tuple[str, np.ndarray]],
    multiples=DEFAULT_MULTIPLES,
    w: Optional[int] = None,
    n_windows: int = 2,
    eps: float = 0.01,
    block_elems: int = BLOCK_ELEMS,
    progress: bool = True,
) -> dict:
    """Far mass, entropy and step spectral gaps of ``model`` on held-out windows.

    docs: held-out (name, tokens) documents; lengths are ``multiples`` of the
    training length, ``n_windows`` windows each (``posenc.evaluate.window_starts``).
    Returns a JSON-ready dict: ``lengths`` (one entry per length: per-layer, per-head
    ``far_mass`` and ``entropy`` lists, their means and the uniform reference),
    ``spectral_gap`` (per layer: beta (H, D/2), baseline (D/2,), w_eps) or None,
    and ``note`` when the scheme is not supported. Raises PosencError for
    impossible lengths or eps, or a ``w`` no evaluation length reaches.
    """
    check_eps(eps)
    model.eval()
    cfg = model.cfg
    lengths = eval_lengths(cfg.train_length, multiples)
    if w is not None and lengths and w >= max(lengths):  # no query has keys that far: every far mass n/a
        raise PosencError(f"far-mass distance w={w} must be < the longest evaluation length {max(lengths)}")
    w = cfg.train_length if w is None else w
    if w < 1 or n_windows < 1:
        raise PosencError(f"need a far-mass distance w >= 1 and >= 1 window per length, got w={w}, windows={n_windows}")
    out = {"scheme": cfg.encoding, "describe": (model.pos_embed or model.blocks[0].attn.enc).describe(), "train_length": cfg.train_length,
           "w": w, "eps": eps, "windows_per_length": n_windows, "lengths": [], "spectral_gap": None, "note": None}
    if unreadable(model):
        out["note"] = f"not supported: {cfg.encoding} replaces attention without exposing its logits, so there is no softmax to read"
        return out
    device = next(model.parameters()).device
    H, L_n = cfg.n_head, cfg.n_layer
    phasors = [0] * L_n  # per layer: sum of exp(i theta), (H, P) complex128 once the layer has phases
    steps = [0] * L_n
    plan = [(L, window_starts(docs, L, n_windows * L)) for L in lengths]
    bar = tqdm(total=sum(len(ws) for _, ws in plan), desc="diagnose", unit="win", leave=False, disable=not progress)
    for L, wins in plan:
        far, ent, bound = (torch.zeros(L_n, H, dtype=torch.float64) for _ in range(3))
        rec = {"length": L, "multiple": L / cfg.train_length, "windows": len(wins)}
        try:
            for d, s in wins:
                tokens = torch.from_numpy(docs[d][1][s : s + L].astype(np.int64))[None].to(device)
                for layer, a in enumerate(model.attention_inputs(tokens)):
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
            out["lengths"].append({**rec, "windows": 0, "note": f"n/a: {exc}"})
            continue
        n_far = len(wins) * max(0, L - w)
        u_far, u_ent = uniform_reference(L, w)
        rec["far_mass"] = (far / n_far).tolist() if n_far else None
        rec["far_mass_bound"] = (bound / n_far).tolist() if n_far else None
        rec["entropy"] = (ent / (len(wins) * L)).tolist()
        rec["far_mass_mean"] = float(far.sum() / (n_far * L_n * H)) if n_far else None
        rec["entropy_mean"] = float(ent.mean() / (len(wins) * L))
        rec["uniform_far_mass"], rec["uniform_entropy"] = u_far, u_ent
        out["lengths"].append(rec)
    bar.close()
    if any(steps):
        out["spectral_gap"] = []
        for layer in (i for i in range(L_n) if steps[i]):  # rotary layers (a '|' pattern may mix in others)
            base = baseline_gap(model.blocks[layer].attn.enc)
            beta = phasors[layer].abs() / max(1, steps[layer])
            beta = torch.where(1 - beta < BETA_ONE, torch.ones_like(beta), beta)
            w_eps = [[_finite(window_size(float(b), eps)) for b in row] for row in beta.tolist()]
            drift = torch.angle(phasors[layer])  # arg mean exp(i theta): the steps' mean rotation per token
            out["spectral_gap"].append({"layer": layer, "steps": steps[layer], "beta": beta.tolist(), "baseline": base,
                                        "w_eps": w_eps, "mean_step": drift.tolist()})
    return out


def _finite(x: float) -> Optional[int]:
    return None if math.isinf(x) else int(x)


def far_mass_records(model: LM, docs, settings: FarMassConfig) -> list[dict]:
    """The cheap pass of ``compare``: one record per length, far mass and entropy means over layers and heads."""
    if not settings.windows or not settings.multiples:
        return []
    res = diagnose_model(model, docs, settings.multiples, n_windows=settings.windows, progress=False)
    if res["note"]:
        return [{"length": L, "note": res["note"]} for L in eval_lengths(model.cfg.train_length, settings.multiples)]
    keep = ("length", "windows", "far_mass_mean", "entropy_mean", "uniform_far_mass", "uniform_entropy", "note")
    return [{k: r[k] for k in keep if k in r} | {"w": res["w"]} for r in res["lengths"]]


# ---------------------------------------------------------------- report


def _fmt(x, spec=".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def markdown(res: dict) -> str:
    """The diagnose tables: far mass and entropy per layer.head and length, spectral gaps per layer."""
    lines = [f"# posenc diagnose: {res['scheme']}", "", f"- scheme: {res['describe']}",
             f"- training length {res['train_length']}; far keys: distance >= w = {res['w']}; "
             f"{res['windows_per_length']} held-out window(s) per length", ""]
    if res["note"]:
        return "\n".join(lines + [f"**{res['note']}**", ""])
    rows = res["lengths"]
    head = ["layer.head", *(f"{r['length']} ({r['multiple']:g}x)" for r in rows)]
    n_layer = max((len(r.get("entropy") or []) for r in rows), default=0)
    n_head = max((len(r["entropy"][0]) for r in rows if r.get("entropy")), default=0)
    for title, key, ref in (
        ("Far attention mass (keys at distance >= w; mean over queries that have such keys)", "far_mass", "uniform_far_mass"),
        ("Far-mass lower bound M / (M + K e^r) (Sec. 4; M far, K = w near keys, r = the query's logit range), "
         "mean over the same queries", "far_mass_bound", None),
        ("Attention entropy (nats; mean over queries)", "entropy", "uniform_entropy"),
    ):
        cells = [[f"{layer}.{h}", *(_fmt(r[key][layer][h]) if r.get(key) else "n/a" for r in rows)]
                 for layer in range(n_layer) for h in range(n_head)]
        cells += [["uniform", *(_fmt(r.get(ref)) for r in rows)]] if ref else []
        lines += [f"## {title}", "", markdown_table(head, cells), ""]
    if res["spectral_gap"]:
        lines += ["## Spectral gap of the step angles", "",
                  f"beta_b = |mean exp(i theta)| per head and frequency block over held-out tokens; baseline: the "
                  f"scheme's step law (|sin a_b / a_b|; RoPE 1); w_eps = ceil(log eps / log beta), eps = {res['eps']:g}.", "",
                  "Blocks that do not mix within the training length keep a near-constant step; their mean step "
                  "arg mean exp(i theta) says whether they still rotate (RoPE-like, unseen phases at longer lengths) or stand still (NoPE-like).", ""]
        head = ["layer", "beta min / median / max", "baseline min / median / max", "max abs(beta - baseline)", "w_eps median",
                "blocks with w_eps <= train length", "others: median abs(mean step) (rad/token)"]
        cells = []
        for g in res["spectral_gap"]:
            beta = np.asarray(g["beta"])
            base = np.asarray(g["baseline"]) if g["baseline"] is not None else None
            w_eps = np.array([np.inf if x is None else x for row in g["w_eps"] for x in row], dtype=float)
            rng = lambda x: f"{x.min():.4f} / {np.median(x):.4f} / {x.max():.4f}"  # noqa: E731
            slow = np.abs(np.asarray(g["mean_step"])).ravel()[w_eps > res["train_length"]]
            cells.append([g["layer"], rng(beta), rng(base) if base is not None else "n/a",
                          _fmt(np.abs(beta - base).max() if base is not None else None, ".4f"), f"{np.median(w_eps):g}",
                          f"{int((w_eps <= res['train_length']).sum())}/{w_eps.size}", _fmt(np.median(slow) if slow.size else None, ".2e")])
        lines += [markdown_table(head, cells), ""]
    return "\n".join(lines)


def plot_vs_length(path: Path, res: dict, key: str, ref: str, ylabel: str, dotted: Optional[str] = None) -> None:
    """One subplot per layer, one line per head (``dotted``: a second quantity per head, dotted),
    the uniform reference dashed; x = length / train length."""
    rows = [r for r in res["lengths"] if r.get(key)]
    n_layer = len(rows[0][key]) if rows else 1
    fig, axes = figure(1, n_layer, figsize=(3.2 * n_layer, 3.2), squeeze=False, sharey=True)
    xs = [r["multiple"] for r in rows]
    for layer, ax in enumerate(axes[0]):
        for h in range(len(rows[0][key][layer]) if rows else 0):
            line, = ax.plot(xs, [r[key][layer][h] for r in rows], marker=".", label=f"head {h}")
            if dotted:
                ax.plot(xs, [r[dotted][layer][h] for r in rows], ls=":", color=line.get_color())
        ax.plot(xs, [r[ref] for r in rows], color="gray", ls="--", label="uniform")
        log_scale(ax, "x", base=2)
        ax.set_title(f"layer {layer}")
        ax.set_xlabel("eval length / train length")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{res['scheme']}: {ylabel}")
    fig.tight_layout()
    save_figure(fig, path)


def plot_spectral_gap(path: Path, res: dict) -> None:
    """beta per frequency block: mean over heads (band: min..max) per layer; the baseline dashed."""
    fig, ax = figure(figsize=(6.5, 4))
    for g in res["spectral_gap"]:
        beta = np.asarray(g["beta"])
        b = np.arange(beta.shape[1])
        ax.plot(b, beta.mean(0), marker=".", label=f"layer {g['layer']}")
        ax.fill_between(b, beta.min(0), beta.max(0), alpha=0.2)
    base = res["spectral_gap"][0]["baseline"]
    if base is not None:
        ax.plot(np.arange(len(base)), base, color="k", ls="--", label="step-law baseline")
    ax.set_xlabel("frequency block b")
    ax.set_ylabel("beta_b = |mean exp(i theta)|")
    ax.set_title(f"{res['scheme']}: spectral gap of the step angles")
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path)


def write_outputs(res: dict, out: Path) -> list[Path]:
    """Write diagnose.md, diagnose.json and the plots into ``out``; returns the paths written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "diagnose.md", out / "diagnose.json"]
    atomic_write_bytes(paths[0], markdown(res).encode())
    write_json(paths[1], res)
    if res["note"]:
        return paths
    if any(r.get("far_mass") for r in res["lengths"]):
        plot_vs_length(out / "far_mass.png", res, "far_mass", "uniform_far_mass", "far attention mass (dotted: lower bound)", "far_mass_bound")
        paths.append(out / "far_mass.png")
    if any(r.get("entropy") for r in res["lengths"]):
        plot_vs_length(out / "entropy.png", res, "entropy", "uniform_entropy", "attention entropy (nats)")
        paths.append(out / "entropy.png")
    if res["spectral_gap"]:
        plot_spectral_gap(out / "spectral_gap.png", res)
        paths.append(out / "spectral_gap.png")
    return paths


# ---------------------------------------------------------------- compare's extra evaluations


def _extra_keys(ev, train_length: int) -> set:
    """(kind, length, depth) of every passkey and far-mass record one compare job writes.

    ev: the preset's EvalConfig (its ``passkey`` and ``far_mass`` settings).
    """
    keys = set()
    if ev.passkey.trials:
        keys |= {("passkey", L, d) for L in eval_lengths(train_length, ev.passkey.lengths_multiples) for d in ev.passkey.depths}
    if ev.far_mass.windows:
        keys |= {("far_mass", L, None) for L in eval_lengths(train_length, ev.far_mass.multiples)}
    return keys


def _recorded(results: Path, scheme: str, seed: int) -> set:
    return {(r.kind, r.length, getattr(r, "depth", None)) for r in load(results)
            if isinstance(r, (PasskeyCell, FarMass)) and (r.scheme, r.seed) == (scheme, seed)}


def extras_pending(ev, train_length: int, results: Path, scheme: str, seed: int) -> bool:
    """True when some passkey or far-mass record of (scheme, seed) is missing from ``results``."""
    return not _extra_keys(ev, train_length) <= _recorded(results, scheme, seed)


def compare_extras(model: LM, ev, data, results: Path, base: dict) -> None:
    """Passkey cells and the cheap far-mass pass of one compare job, appended to ``results``.

    base: {"scheme", "seed", "train_length"} copied into each record; records
    already present are skipped (a rerun resumes).
    """
    done = _recorded(results, base["scheme"], base["seed"])
    for rec in passkey_records(model, data.tokenizer, ev.passkey, {(L, d) for k, L, d in done if k == "passkey"}):
        append(results, PasskeyCell(**base, **rec))
    todo = [m for m in ev.far_mass.multiples if ("far_mass", m * base["train_length"], None) not in done]
    for rec in far_mass_records(model, data.val_docs, ev.far_mass.model_copy(update={"multiples": todo})):
        append(results, FarMass(**base, **rec))
