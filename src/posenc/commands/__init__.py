"""The subcommands of ``posenc`` (``posenc.cli`` lists them), and what their parsers share."""

import math

from posenc.errors import PosencError


def shown(value) -> str:
    """A config value as a help string shows it: a list space-separated, None as 'none', a float as %g."""
    if isinstance(value, (list, tuple)):
        return " ".join(map(shown, value)) or "none"
    if isinstance(value, float):
        return f"{value:g}"
    return "none" if value is None else str(value)


def number_list(flag: str, text: str) -> list[float]:
    """A comma-separated list of finite numbers as given to ``flag`` (``1.0,1.5,2``; LongRoPE's ``--short-factor``).
    PosencError naming the flag for an empty entry or one that is not a finite number."""
    try:
        out = [float(v) for v in text.split(",")]
    except ValueError:
        raise PosencError(f"{flag} takes comma-separated numbers, got {text!r}") from None
    if not all(map(math.isfinite, out)):
        raise PosencError(f"{flag} takes finite numbers, got {text!r}")
    return out
