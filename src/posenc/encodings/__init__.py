"""Registry of positional schemes.

``get(name, dims)`` builds a scheme for one attention layer; ``names()`` lists
them. A name may be an alias (a registered scheme with preset parameters, e.g.
``acc-rand-qkv``) and may combine one part per hook with ``+`` (e.g.
``acc-rand-qkv+alibi``): phases from the rotary part, biases added.
"""

from __future__ import annotations

from typing import Any

from posenc.encodings.base import Dims, Encoding, Inputs
from posenc.errors import PosencError

_REGISTRY: dict[str, type[Encoding]] = {}
_ALIASES: dict[str, tuple[str, dict[str, Any], str]] = {}


def register(cls: type[Encoding]) -> type[Encoding]:
    """Class decorator: make a scheme available by its ``name``."""
    _REGISTRY[cls.name] = cls
    return cls


def alias(name: str, scheme: str, doc: str, **params: Any) -> None:
    """Register ``name`` as ``scheme`` with preset parameters."""
    _ALIASES[name] = (scheme, params, doc)


def names() -> list[str]:
    """All registered schemes and aliases, sorted."""
    return sorted(set(_REGISTRY) | set(_ALIASES))


def describe_all() -> dict[str, str]:
    """name -> first docstring line (or the alias's description)."""
    out = {n: (c.__doc__ or "").strip().splitlines()[0] for n, c in _REGISTRY.items()}
    out.update({n: f"{doc} (= {s} {p})" for n, (s, p, doc) in _ALIASES.items()})
    return dict(sorted(out.items()))


def resolve(name: str, params: dict[str, Any] | None = None) -> tuple[type[Encoding], dict[str, Any]]:
    """Scheme class and merged parameters for a single (non-composite) name."""
    params = dict(params or {})
    if name in _ALIASES:
        scheme, preset, _ = _ALIASES[name]
        return resolve(scheme, {**preset, **params})
    if name not in _REGISTRY:
        raise PosencError(f"unknown scheme {name!r}; valid: {', '.join(names())}")
    return _REGISTRY[name], params


def get(name: str, dims: Dims | None = None, **params: Any) -> Encoding:
    """Build scheme ``name`` for one attention layer.

    ``dims`` defaults to a small layer (4 heads of 32, vocab 256, length 128).
    Raises PosencError for an unknown name or invalid parameters.
    """
    dims = dims or Dims(n_head=4, head_dim=32, d_model=128, vocab_size=256, train_length=128)
    parts = name.split("+")
    if len(parts) > 1:
        from posenc.encodings.composite import Composite

        return Composite(dims, [get(p, dims) for p in parts], name)
    cls, merged = resolve(name, params)
    try:
        return cls(dims, **merged)
    except TypeError as exc:
        raise PosencError(f"invalid parameters for scheme {name!r}: {exc}") from None


# Importing the families registers them.
from posenc.encodings import absolute, accumulated, bias, forget, householder, polar, rotary, xpos  # noqa: E402,F401

__all__ = ["Dims", "Encoding", "Inputs", "alias", "describe_all", "get", "names", "register", "resolve"]
