"""RoPE frequencies and context-extension schedules: the one definition for own and Hugging Face models.

Each schedule is one record (:class:`Schedule`) in ``SCHEDULES``: its parameters and
defaults, its checks, its frequency function in the style of Hugging Face's
``modeling_rope_utils``, its attention factor and its transformers ``rope_parameters``.
Calling the record gives the frequencies::

    SCHEDULES[name](head_dim, rope_theta, params, seq_len) -> (inv_freq (D/2,) float64 rad/token, attention_factor)

``attention_factor`` multiplies both cos and sin, so the attention logits are
scaled by its square (``RoPE.logit_scale = attention_factor ** 2``). ``L0`` below
is ``original_max_position_embeddings`` (default: the model's training length),
``s`` the ``factor`` and ``omega_i = rope_theta^(-2i/D)``.

=================  ==========================================================  ==================
name               inverse frequencies                                          source
=================  ==========================================================  ==================
``none``           omega_i (plain RoPE)                                         Su et al. 2021
``pi``             omega_i / s (positions / s)                                  Chen et al. 2023, eq. 2
``ntk``            base' = base * s^(D/(D-2)) (static)                          bloc97 2023 (NTK-aware)
``dynamic``        base' = base * (s L/L0 - (s-1))^(D/(D-2)) for L = the        emozilla 2023;
                   current sequence length > L0, else omega                     HF ``dynamic``
``yarn``           ramp between omega_i/s and omega_i over the pair index,      Peng et al. 2023,
                   from r_i = L0/lambda_i = beta_fast (unchanged) down to       sec. 3.2-3.4 and the
                   r_i = beta_slow (fully interpolated); attention factor       reference code;
                   0.1 ln s + 1 unless ``attention_factor`` is given, or        DeepSeek-V2 (mscale,
                   with DeepSeek's ``mscale`` m and ``mscale_all_dim`` a:       HF ``yarn``)
                   (0.1 m ln s + 1) / (0.1 a ln s + 1)
``llama3``         wavelength bands: > L0/low_freq_factor -> omega/s,           Meta Llama 3.1;
                   < L0/high_freq_factor -> omega, smooth in between            HF ``llama3``
``longrope``       omega_i / short_factor_i while the sequence length L <= L0,  Ding et al. 2024
                   omega_i / long_factor_i for L > L0 (lists of D/2 factors     (LongRoPE), Phi-3;
                   a model ships); attention factor sqrt(1 + ln s / ln L0)      HF ``longrope``
                   for s > 1 unless ``attention_factor`` is given
``rerope``         omega; relative position min(i-j, w) (``window`` w)          Su 2023 (ReRoPE)
``leaky-rerope``   omega; relative position w + (i-j-w)/k beyond w (``leak``)   Su 2023
=================  ==========================================================  ==================

YaRN's ramp: the paper writes gamma(r) linear in r; the reference implementation
(and Hugging Face) ramps linearly in the pair index between the (floored/ceiled
with ``truncate``) indices where r = beta_fast and r = beta_slow. posenc follows
the reference code, so its frequencies equal transformers' (golden tests).
``factor`` is always the given s, never replaced by a length ratio.

ReRoPE and leaky ReRoPE keep plain frequencies and replace attention
(``posenc.rope.rerope``). ``none`` is plain RoPE. One name per schedule is used by
``posenc eval --rope-schedule``, presets, ``posenc extend --schedules`` and every
report; ``posenc.hf.rope_parameters`` turns a record's ``hf`` into transformers' ``rope_parameters``.

LongRoPE's switch: the schedule takes the long factors for a sequence of L > L0
positions (``seq_len``; L = L0 keeps the short ones), as transformers'
``_compute_longrope_parameters``; the attention factor does not change at the
switch. Its factor lists come from a search per model (Phi-3 ships them), so
``longrope`` has no defaults and is not among the ``NAMES`` that commands default to.
A transformers model picks one list per forward from its largest position + 1, so
with the KV cache the keys cached before the switch keep the short factors while
later queries and keys take the long ones (``posenc.hf.schedules`` warns).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable
from typing import Any

import torch

from posenc.errors import PosencError

TWO_PI = 2 * math.pi


def rope_inv_freq(head_dim: int, rope_theta: float = 10000.0) -> torch.Tensor:
    """omega_i = rope_theta^(-2i/D), i = 0..D/2-1: (D/2,) float64 radians per token (Su et al. 2021, RoFormer).

    Raises PosencError unless rope_theta is a finite number > 1.
    """
    if not (math.isfinite(rope_theta) and rope_theta > 1):
        raise PosencError(f"rope_theta must be a finite number > 1, got {rope_theta}")
    return rope_theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def wrap_phases(phi: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Reduce float64 angles mod 2 pi, then cast to ``dtype`` (float32 or float64, never lower).

    The result is contiguous: the four rotations of an attention layer run ~1.5x
    faster on CPU than with the permuted layout a per-head projection leaves.
    """
    return torch.remainder(phi, TWO_PI).to(
        torch.promote_types(dtype, torch.float32), memory_format=torch.contiguous_format
    )


def ntk_base(rope_theta: float, factor: float, head_dim: int) -> float:
    """NTK-aware base b * s^(D/(D-2)) (bloc97 2023): the lowest frequency divided by s, the highest kept."""
    return rope_theta * factor ** (head_dim / (head_dim - 2))


def yarn_attention_factor(s: float, mscale: float = 1.0) -> float:
    """YaRN's sqrt(1/t) = 0.1 mscale ln s + 1 for s > 1, else 1 (Peng et al. 2023, eq. 22, mscale 1; DeepSeek's
    ``yarn_get_mscale`` takes other mscale: transformers' ``yarn_get_mscale``)."""
    return 0.1 * mscale * math.log(s) + 1.0 if s > 1 else 1.0


def yarn_factor(p: dict) -> float:
    """The attention factor (multiplying cos and sin) of validated yarn parameters ``p``: ``attention_factor`` when
    given; with DeepSeek's ``mscale`` m and ``mscale_all_dim`` a, mscale(s, m) / mscale(s, a)
    (``yarn_attention_factor``; 1 for DeepSeek-V3's m = a = 1), as transformers' ``_compute_yarn_parameters``;
    else mscale(s, 1) = 0.1 ln s + 1."""
    if p["attention_factor"] is not None:
        return p["attention_factor"]
    if p["mscale"] is not None:
        return yarn_attention_factor(p["factor"], p["mscale"]) / yarn_attention_factor(p["factor"], p["mscale_all_dim"])
    return yarn_attention_factor(p["factor"])


def yarn_logit_scale(p: dict) -> float:
    """What an MLA model (DeepSeek-V2/V3) multiplies its whole softmax scale by under yarn parameters ``p``:
    mscale(s, a)^2 with a = ``mscale_all_dim`` (transformers' ``yarn_apply_mscale``), on the position-free and the
    rotary part of every score alike; 1 without it. (The rotary part also carries ``yarn_factor`` squared, through
    cos and sin.)"""
    return yarn_attention_factor(p["factor"], p["mscale_all_dim"]) ** 2 if p.get("mscale_all_dim") else 1.0


def longrope_attention_factor(s: float, L0: int) -> float:
    """LongRoPE's sqrt(1 + ln s / ln L0) for s > 1, else 1 (transformers' default for ``longrope``)."""
    return math.sqrt(1 + math.log(s) / math.log(L0)) if s > 1 else 1.0


def longrope_factors(p: dict, head_dim: int, long: bool) -> torch.Tensor:
    """The (D/2,) float64 ``long_factor`` (``long``) or ``short_factor`` list of validated parameters ``p``;
    PosencError unless it has D/2 entries."""
    key = "long_factor" if long else "short_factor"
    if len(p[key]) != head_dim // 2:
        raise PosencError(f"longrope: {key} has {len(p[key])} entries; head dim {head_dim} needs {head_dim // 2}")
    return torch.tensor(p[key], dtype=torch.float64)


class Default(enum.Enum):
    """A parameter default that is not a value: the caller must give it, or the model's training length L0."""

    REQUIRED = "required"
    TRAIN_LENGTH = "L0"


REQUIRED, TRAIN_LENGTH = Default.REQUIRED, Default.TRAIN_LENGTH


@dataclasses.dataclass(frozen=True)
class HFRope:
    """A schedule as transformers' ``rope_parameters``: its ``rope_type``, the schedule parameters transformers
    reads there (``keys``), ``base(rope_theta, params, head_dim)`` where transformers is given another base than
    the model's, and ``config``: (config attribute, parameter) pairs transformers reads from the model config
    instead (its ``dynamic`` takes L0 from ``max_position_embeddings``)."""

    rope_type: str
    keys: tuple[str, ...] = ()
    base: Callable[[float, dict, int], float] | None = None
    config: tuple[tuple[str, str], ...] = ()


def _no_check(*args) -> None:
    pass


def _unit_factor(p: dict) -> float:
    return 1.0


@dataclasses.dataclass(frozen=True)
class Schedule:
    """One RoPE schedule, all of it: a new schedule is one entry of ``SCHEDULES``.

    - ``inv_freq(head_dim, rope_theta, params, seq_len)``: (D/2,) float64 rad/token from validated
      ``params``; ``seq_len`` is the current sequence length (None: the training length L0);
    - ``defaults``: the parameters it takes, in order, with their defaults (a value; None: unset,
      optional; ``REQUIRED``; ``TRAIN_LENGTH``: L0);
    - ``check(name, params)``: its range checks beyond the common ones of ``schedule_params``
      (PosencError; may normalise values in place);
    - ``attention_factor(params)``: multiplies cos and sin, so the logits scale by its square;
    - ``hf``: its transformers ``rope_parameters`` (``posenc.hf.rope_parameters``);
    - ``check_head_dim(params, head_dim)``: PosencError for parameters that do not fit the head dim;
    - ``replaces_attention``: ReRoPE's attention (``posenc.rope.rerope``) instead of rotated q, k;
    - ``shipped``: its parameters come with a model (searched lists): valid by name, never a default schedule.

    Calling it gives ``(inv_freq, attention_factor)``.
    """

    name: str
    inv_freq: Callable[[int, float, dict, int | None], torch.Tensor]
    hf: HFRope
    defaults: dict[str, Any] = dataclasses.field(default_factory=dict)
    check: Callable[[str, dict], None] = _no_check
    attention_factor: Callable[[dict], float] = _unit_factor
    check_head_dim: Callable[[dict, int], None] = _no_check
    replaces_attention: bool = False
    shipped: bool = False

    def __call__(
        self, head_dim: int, rope_theta: float, params: dict, seq_len: int | None = None
    ) -> tuple[torch.Tensor, float]:
        return self.inv_freq(head_dim, rope_theta, params, seq_len), float(self.attention_factor(params))


def _plain(head_dim, rope_theta, p, seq_len):
    return rope_inv_freq(head_dim, rope_theta)


def _pi(head_dim, rope_theta, p, seq_len):
    return rope_inv_freq(head_dim, rope_theta) / p["factor"]


def _ntk(head_dim, rope_theta, p, seq_len):
    return rope_inv_freq(head_dim, ntk_base(rope_theta, p["factor"], head_dim))


def _dynamic(head_dim, rope_theta, p, seq_len):
    L0, s = p["original_max_position_embeddings"], p["factor"]
    L = max(seq_len or L0, L0)  # the current length only: never a stale longer one
    return rope_inv_freq(head_dim, ntk_base(rope_theta, s * L / L0 - (s - 1), head_dim))


def _yarn(head_dim, rope_theta, p, seq_len):
    s, L0 = p["factor"], p["original_max_position_embeddings"]
    omega = rope_inv_freq(head_dim, rope_theta)

    def pair_index(rotations):  # the i with r_i = L0 omega_i / (2 pi) = rotations
        return head_dim * math.log(L0 / (rotations * 2 * math.pi)) / (2 * math.log(rope_theta))

    low, high = pair_index(p["beta_fast"]), pair_index(p["beta_slow"])
    if p["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # as the reference: avoid a zero-width ramp
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    return omega / s * ramp + omega * (1 - ramp)  # ramp 0: high frequencies kept


def _check_yarn(name, p):
    if not p["beta_fast"] > p["beta_slow"] > 0:
        raise PosencError(
            f"yarn needs beta_fast > beta_slow > 0, got beta_fast={p['beta_fast']}, beta_slow={p['beta_slow']}"
        )
    for key in ("mscale", "mscale_all_dim"):  # transformers reads 0 as unset: a given 0 would do nothing
        if p[key] is not None and not p[key] > 0:
            raise PosencError(f"yarn: {key} must be > 0 (leave it unset for none), got {p[key]}")
    if (p["mscale"] is None) != (p["mscale_all_dim"] is None):  # transformers ignores one without the other
        raise PosencError("yarn: mscale and mscale_all_dim go together (DeepSeek's attention factor is their ratio)")
    if p["mscale"] is not None and p["attention_factor"] is not None:
        raise PosencError("yarn: give attention_factor or mscale and mscale_all_dim, not both (the first wins)")


def _llama3(head_dim, rope_theta, p, seq_len):
    s, L0 = p["factor"], p["original_max_position_embeddings"]
    lo, hi = p["low_freq_factor"], p["high_freq_factor"]
    omega = rope_inv_freq(head_dim, rope_theta)
    wavelen = 2 * math.pi / omega
    smooth = (L0 / wavelen - lo) / (hi - lo)
    mid = (1 - smooth) * omega / s + smooth * omega
    out = torch.where(wavelen > L0 / lo, omega / s, omega)
    return torch.where((wavelen >= L0 / hi) & (wavelen <= L0 / lo), mid, out)


def _check_llama3(name, p):
    if not p["high_freq_factor"] > p["low_freq_factor"] > 0:
        raise PosencError("llama3 needs high_freq_factor > low_freq_factor > 0")


def _longrope(head_dim, rope_theta, p, seq_len):
    ext = longrope_factors(p, head_dim, long=seq_len is not None and seq_len > p["original_max_position_embeddings"])
    return rope_inv_freq(head_dim, rope_theta) / ext


def _check_longrope(name, p):
    for key in ("short_factor", "long_factor"):
        v = p[key]
        if not (
            isinstance(v, (list, tuple))
            and v
            and all(isinstance(f, (int, float)) and not isinstance(f, bool) and math.isfinite(f) and f > 0 for f in v)
        ):
            raise PosencError(f"longrope: {key} must be a non-empty list of finite numbers > 0, got {v!r}")
        p[key] = [float(f) for f in v]


def _check_rerope(name, p):
    if not (p["window"] > 0 and float(p["window"]).is_integer()):
        raise PosencError(f"rope schedule {name!r}: window must be a positive integer, got {p['window']}")
    if "leak" in p and not p["leak"] > 1:
        raise PosencError(f"leaky-rerope: leak k must be > 1, got {p['leak']}")


def _given_or(default: Callable[[dict], float]) -> Callable[[dict], float]:
    """An attention factor: the ``attention_factor`` parameter when set, else ``default(params)``."""
    return lambda p: p["attention_factor"] if p["attention_factor"] is not None else default(p)


def _check_longrope_dims(p, head_dim):
    for long in (False, True):
        longrope_factors(p, head_dim, long)


SCHEDULES: dict[str, Schedule] = {
    s.name: s
    for s in (
        Schedule("none", _plain, HFRope("default")),
        Schedule("pi", _pi, HFRope("linear", ("factor",)), {"factor": REQUIRED}),
        # transformers has no static NTK type: its ``default`` with the raised base
        Schedule(
            "ntk",
            _ntk,
            HFRope("default", base=lambda theta, p, head_dim: ntk_base(theta, p["factor"], head_dim)),
            {"factor": REQUIRED},
        ),
        # transformers' dynamic reads L0 from the config's max_position_embeddings, not from rope_parameters
        Schedule(
            "dynamic",
            _dynamic,
            HFRope("dynamic", ("factor",), config=(("max_position_embeddings", "original_max_position_embeddings"),)),
            {"factor": REQUIRED, "original_max_position_embeddings": TRAIN_LENGTH},
        ),
        Schedule(
            "yarn",
            _yarn,
            HFRope(
                "yarn",
                (
                    "factor",
                    "original_max_position_embeddings",
                    "beta_fast",
                    "beta_slow",
                    "attention_factor",
                    "truncate",
                    "mscale",
                    "mscale_all_dim",
                ),
            ),
            {
                "factor": REQUIRED,
                "original_max_position_embeddings": TRAIN_LENGTH,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "attention_factor": None,
                "truncate": True,
                "mscale": None,
                "mscale_all_dim": None,
            },
            _check_yarn,
            yarn_factor,
        ),
        Schedule(
            "llama3",
            _llama3,
            HFRope("llama3", ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor")),
            {
                "factor": REQUIRED,
                "original_max_position_embeddings": TRAIN_LENGTH,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
            },
            _check_llama3,
        ),
        Schedule(
            "longrope",
            _longrope,
            HFRope(
                "longrope",
                ("factor", "original_max_position_embeddings", "short_factor", "long_factor", "attention_factor"),
            ),
            {
                "factor": REQUIRED,
                "original_max_position_embeddings": TRAIN_LENGTH,
                "short_factor": REQUIRED,
                "long_factor": REQUIRED,
                "attention_factor": None,
            },
            _check_longrope,
            _given_or(lambda p: longrope_attention_factor(p["factor"], p["original_max_position_embeddings"])),
            _check_longrope_dims,
            shipped=True,
        ),
        Schedule("rerope", _plain, HFRope("default"), {"window": REQUIRED}, _check_rerope, replaces_attention=True),
        Schedule(
            "leaky-rerope",
            _plain,
            HFRope("default"),
            {"window": REQUIRED, "leak": REQUIRED},
            _check_rerope,
            replaces_attention=True,
        ),
    )
}
SHIPPED = tuple(n for n, s in SCHEDULES.items() if s.shipped)
NAMES = tuple(
    n for n in SCHEDULES if n not in SHIPPED
)  # the one naming (CLI, presets, reports) and the default schedules
RELATIVE = tuple(n for n, s in SCHEDULES.items() if s.replaces_attention)  # schedules that replace attention


MAX_FACTOR = 1e6  # an extension far past any context a model runs (8K -> 8G tokens); larger overflows float math
MAX_POSITION = 1 << 40


def check_name(name: str) -> str:
    """``name`` if it is a schedule; PosencError naming the valid names."""
    if name not in SCHEDULES:
        raise PosencError(f"unknown rope schedule {name!r}; valid: {', '.join(SCHEDULES)}")
    return name


def schedule_params(name: str, train_length: int, params: dict | None = None) -> dict[str, Any]:
    """Validated parameters of schedule ``name`` with defaults filled in.

    Raises PosencError (one line) for an unknown or renamed schedule or parameter, a missing
    required one, a non-finite number, factor outside [1, MAX_FACTOR], original_max_position_embeddings not an
    integer in [2, 2^40], a beta, frequency factor or mscale larger than MAX_FACTOR, attention_factor <= 0, and the
    schedule's own
    checks (``Schedule.check``): beta_fast <= beta_slow, yarn's mscale or mscale_all_dim <= 0, one without the
    other or with attention_factor, window <= 0, leak <= 1,
    high_freq_factor <= low_freq_factor, LongRoPE factor lists that are not non-empty lists of
    finite numbers > 0 (their length, D/2, is checked where the head dim is known: the schedule function).
    """
    schedule = SCHEDULES[check_name(name)]
    given = {k: v for k, v in (params or {}).items() if v is not None}
    unknown = set(given) - set(schedule.defaults)
    if unknown:
        raise PosencError(
            f"rope schedule {name!r} takes {', '.join(schedule.defaults) or 'no parameters'}; "
            f"got {', '.join(sorted(unknown))}"
        )
    out = {k: train_length if d is TRAIN_LENGTH else d for k, d in schedule.defaults.items()}
    out.update(given)
    missing = [k for k, v in out.items() if v is REQUIRED]
    if missing:
        raise PosencError(f"rope schedule {name!r} needs {', '.join(sorted(missing))}")
    for k, v in out.items():  # inf/nan pass the range checks below as NaN logits
        if isinstance(v, float) and not math.isfinite(v):
            raise PosencError(f"rope schedule {name!r}: {k} must be finite, got {v}")
    if "factor" in out and not 1 <= out["factor"] <= MAX_FACTOR:
        raise PosencError(f"rope schedule {name!r}: factor must be from 1 to {MAX_FACTOR:g}, got {out['factor']}")
    l0 = out.get("original_max_position_embeddings")
    if l0 is not None and (isinstance(l0, bool) or not isinstance(l0, int) or not 2 <= l0 <= MAX_POSITION):
        raise PosencError(
            f"rope schedule {name!r}: original_max_position_embeddings (L0) must be an integer from 2 to 2^40 "
            f"tokens, got {l0!r}"
        )
    for k in ("beta_fast", "beta_slow", "low_freq_factor", "high_freq_factor", "mscale", "mscale_all_dim"):
        if out.get(k) is not None and not abs(out[k]) <= MAX_FACTOR:  # past it the angles' math overflows
            raise PosencError(f"rope schedule {name!r}: {k} must be at most {MAX_FACTOR:g} in size, got {out[k]}")
    if out.get("attention_factor") is not None and not out["attention_factor"] > 0:
        raise PosencError(f"rope schedule {name!r}: attention_factor must be > 0, got {out['attention_factor']}")
    schedule.check(name, out)
    return out


def check_window(params: dict, eval_length: int) -> None:
    """ReRoPE's window must be shorter than the evaluation length (else it is plain RoPE)."""
    w = params.get("window")
    if w is not None and w >= eval_length:
        raise PosencError(f"rerope window {w} must be < the evaluation length {eval_length}")


def schedule_label(name: str, params: dict, train_length: int | None = None) -> str:
    """Short row name, e.g. ``yarn(s=8)``, ``rerope(w=64)``, ``leaky-rerope(w=64,k=16)``, ``none``; a setting
    other than the schedule's default is added as ``key=value`` (``yarn(s=4,beta_slow=0.25)``; L0 against
    ``train_length``, when given), so two rows of one schedule and factor are told apart. LongRoPE's factor
    lists are left out (a row per list: :func:`posenc.config.plan` refuses two rows of one label)."""
    if not params:
        return name
    if "window" in params:
        main = f"w={params['window']:g}" + (f",k={params['leak']:g}" if "leak" in params else "")
    else:
        main = f"s={params['factor']:g}"
    defaults, extra = SCHEDULES[name].defaults if name in SCHEDULES else {}, []
    for k, v in params.items():
        default = defaults.get(k, v)
        if default is TRAIN_LENGTH:
            default = v if train_length is None else train_length
        if k not in ("factor", "window", "leak") and not isinstance(v, list) and v != default:
            shown = v if isinstance(v, bool) else f"{v:g}"
            extra.append(f"{'L0' if k == 'original_max_position_embeddings' else k}={shown}")
    return f"{name}({','.join([main, *extra])})"
