"""The scheme registry and the scheme-spec syntax.

A scheme spec is one or more parts joined by ``+``, each ``NAME`` or
``NAME:key=value[,key=value]``: ``rope:rope_theta=500000``,
``acc-rand-qkv:a=0.3+alibi``. ``NAME`` is a registered scheme or an alias (a
scheme with preset parameters, e.g. ``acc-rand-qkv``, or a named composition,
e.g. ``hybrid``). ``parts(spec)`` parses and validates a spec; building it is
``posenc.encodings.get``.
"""

from __future__ import annotations

import inspect
from typing import Any

from posenc.encodings.base import Encoding
from posenc.errors import PosencError

_REGISTRY: dict[str, type[Encoding]] = {}
_ALIASES: dict[str, tuple[str, dict[str, Any], str]] = {}


def register(cls: type[Encoding]) -> type[Encoding]:
    """Class decorator: make a scheme available by its ``name``."""
    _REGISTRY[cls.name] = cls
    return cls


def alias(name: str, spec: str, doc: str, **params: Any) -> None:
    """Register ``name`` as ``spec`` (a scheme, or a composition ``A+B``) with preset parameters."""
    _ALIASES[name] = (spec, params, doc)


def names() -> list[str]:
    """All registered schemes and aliases, sorted."""
    return sorted(set(_REGISTRY) | set(_ALIASES))


def describe_all() -> dict[str, str]:
    """name -> first docstring line (or the alias's description)."""
    out = {n: (c.__doc__ or "").strip().splitlines()[0] for n, c in _REGISTRY.items()}
    out.update({n: f"{doc} (= {s}{' ' + str(p) if p else ''})" for n, (s, p, doc) in _ALIASES.items()})
    return dict(sorted(out.items()))


def _value(text: str) -> Any:
    """A spec value: bool, int, float, or the string itself."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def _split_part(part: str) -> tuple[str, dict[str, Any]]:
    """``NAME:k=v,k=v`` -> (NAME, {k: v}); PosencError if malformed."""
    name, _, args = part.partition(":")
    params = {}
    for item in filter(None, args.split(",")) if args else ():
        key, eq, val = item.partition("=")
        if not eq or not key.strip() or not val.strip():
            raise PosencError(f"scheme spec {part!r}: expected key=value, got {item!r}")
        params[key.strip()] = _value(val.strip())
    if not name.strip():
        raise PosencError(f"scheme spec {part!r}: missing scheme name")
    return name.strip(), params


def _accepted(cls: type[Encoding]) -> set[str]:
    return set(inspect.signature(cls.__init__).parameters) - {"self", "dims"}


def resolve(name: str, params: dict[str, Any] | None = None) -> tuple[type[Encoding], dict[str, Any]]:
    """Scheme class and merged parameters of one part (``NAME`` or ``NAME:k=v``, not a composition).

    Raises PosencError for an unknown name or a parameter the scheme does not take.
    """
    base, own = _split_part(name)
    params = {**own, **(params or {})}
    name = base
    while name in _ALIASES:
        target, preset, _ = _ALIASES[name]
        if "+" in target:
            raise PosencError(f"{base!r} is a composition ({target}); give parameters to its parts")
        name, params = target, {**preset, **params}
    if name not in _REGISTRY:
        raise PosencError(f"unknown scheme {base!r}; valid: {', '.join(names())}")
    cls = _REGISTRY[name]
    unknown = sorted(set(params) - _accepted(cls))
    if unknown:
        raise PosencError(f"scheme {base!r} has no parameter {', '.join(map(repr, unknown))}; valid: {', '.join(sorted(_accepted(cls))) or 'none'}")
    return cls, params


def parts(spec: str) -> list[tuple[type[Encoding], dict[str, Any]]]:
    """(class, parameters) of every part of ``spec``, named compositions expanded; PosencError if invalid."""
    out = []
    for part in spec.split("+"):
        base, params = _split_part(part)
        target = _ALIASES.get(base, ("",))[0]
        if "+" in target and not params:
            out += parts(target)
        else:
            out.append(resolve(part))
    return out
