"""posenc: positional encodings and length extrapolation for decoder-only transformers.

``import posenc`` loads nothing but this file: each name below is imported on
first access (PEP 562), so ``import posenc.attention`` or ``posenc.PosencError``
pulls in neither the LM's pydantic config nor ``posenc.hf.scheme`` and transformers.
``posenc.attention`` is the attention-core module (its function is
``posenc.attention.attention``): a package attribute cannot be both.
"""

import importlib

# public name -> the module defining it; "" marks a submodule exported by name
_EXPORTS = {
    "LM": "posenc.model",
    "Attention": "posenc.layer",
    "LayerCache": "posenc.layer",
    "ModelConfig": "posenc.model",
    "PosencError": "posenc.errors",
    "Prepared": "posenc.layer",
    "attend": "posenc.layer",
    "build_model": "posenc.model",
    "encodings": "",
    "hf": "",
    "prepare": "posenc.layer",
}

__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str):
    """The public name ``name``, imported now; AttributeError for any other."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'posenc' has no attribute {name!r}")
    module = importlib.import_module(_EXPORTS[name] or f"posenc.{name}")
    value = module if not _EXPORTS[name] else getattr(module, name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
