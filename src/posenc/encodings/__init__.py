"""Registry of positional schemes: ``get(spec, dims)`` builds one for an attention layer.

A spec is one or more parts joined by ``+``, each ``NAME`` or
``NAME:key=value[,key=value]`` (``posenc.encodings.registry``): e.g.
``acc-rand-qkv:a=0.3+alibi``. Parts combine one per hook: phases from the
rotary part, biases added (``posenc.encodings.composite``).
"""

from __future__ import annotations

from typing import Any

from posenc.encodings import absolute, accumulated, bias, cope, dape, fire, forget, householder, polar, relative, rotary, xpos  # noqa: F401 (registers the families)
from posenc.encodings.base import Dims, Encoding, Inputs
from posenc.encodings.composite import Composite
from posenc.encodings.registry import alias, check_types, describe_all, names, parts, register, resolve, split_part, unregister
from posenc.errors import PosencError


def _build(cls: type[Encoding], params: dict[str, Any], dims: Dims, spec: str) -> Encoding:
    check_types(spec, cls, params)  # parameters given in Python too, not only in the spec
    try:
        return cls(dims, **params)
    except (TypeError, ValueError, AttributeError) as exc:
        raise PosencError(f"invalid parameters for scheme {spec!r}: {exc}") from None


def get(spec: str, dims: Dims | None = None, **params: Any) -> Encoding:
    """Build scheme ``spec`` for one attention layer.

    ``dims`` defaults to a small layer (4 heads of 32, vocab 256, length 128);
    ``params`` apply to a single-part spec (for a composition give them in the
    spec, per part). Raises PosencError for an unknown name, an unknown
    parameter or an invalid value.
    """
    dims = dims or Dims(n_head=4, head_dim=32, d_model=128, vocab_size=256, train_length=128)
    resolved = parts(spec)
    if len(resolved) == 1:
        cls, merged = resolved[0]
        clash = sorted(set(params) & set(split_part(spec)[1]))
        if clash:
            raise PosencError(f"{spec!r}: parameter {', '.join(map(repr, clash))} given both in the spec and separately")
        return _build(cls, {**merged, **params}, dims, spec)
    if params:
        raise PosencError(f"{spec!r} is a composition: give parameters per part (NAME:key=value)")
    return Composite(dims, [_build(c, p, dims, spec) for c, p in resolved], spec)


__all__ = ["Dims", "Encoding", "Inputs", "alias", "describe_all", "get", "names", "parts", "register", "resolve", "unregister"]
