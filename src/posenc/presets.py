"""Presets as data: YAML files shipped as package data (``posenc/configs/``, read with
``importlib.resources`` so an installed wheel has them) or given by path, validated by a pydantic
model into a one-line error. compare (``posenc.config``), extend and theory read theirs here.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError

from posenc.errors import PosencError

SHIPPED = importlib.resources.files("posenc") / "configs"  # package data: works from a wheel too


def preset_names(folder=SHIPPED) -> list[str]:
    """The presets shipped in ``folder`` (package data)."""
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))


def read_preset(name_or_path: str, folder=SHIPPED, kind: str = "preset") -> tuple[Path, dict]:
    """(path, settings) of preset ``name_or_path``: a name in ``folder`` or a YAML file's path (any extension).

    Raises PosencError (one line, naming the ``kind``) for an unknown preset, invalid YAML or a
    file that is not a mapping of settings.
    """
    path, shipped = Path(name_or_path), folder / f"{name_or_path}.yaml"
    bare = not path.suffix and path.name == name_or_path  # "quick"; "./mypreset" and "my.yaml" are paths
    if bare and (shipped.is_file() or not path.is_file()):  # a shipped name wins over a stray local file
        path = shipped
    if not path.is_file():
        raise PosencError(f"unknown {kind} {name_or_path!r}; valid: {', '.join(preset_names(folder))}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise PosencError(f"{kind} {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    except UnicodeDecodeError:
        raise PosencError(f"{kind} {path} is not UTF-8 text") from None
    if not isinstance(data, dict):
        raise PosencError(f"{kind} {path} is not a YAML mapping of settings")
    return path, data


def validated(cls: type, data: dict, where: str):
    """``cls`` (a pydantic model or a standard-library dataclass such as ``ModelConfig``) built from ``data``; the
    first validation error as one PosencError line naming ``where`` and the field (``config`` for a check of the
    whole object)."""
    try:
        return TypeAdapter(cls).validate_python(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise PosencError(f"invalid {where}: {'.'.join(map(str, err['loc'])) or 'config'}: {err['msg']}") from None


def load_flat(cls: type[BaseModel], name_or_path: str, folder, kind: str, overrides: dict | None = None):
    """A preset whose keys are a command's flags: ``cls`` built from preset ``name_or_path`` (a name in
    ``folder`` or a YAML path) with ``overrides`` (the given flags) replacing its keys. PosencError as
    :func:`read_preset` and :func:`validated`, naming the ``kind``, and for a key ``cls.renamed_keys`` lists (an
    earlier version's name: the error names the new one)."""
    path, data = read_preset(name_or_path, folder, kind)
    for old, new in getattr(cls, "renamed_keys", {}).items():
        if old in data:
            raise PosencError(f"{kind} {path.name}: key {old!r} was renamed: use {new!r}")
    where = f"{kind} {path.name}" + (" with command-line options" if overrides else "")
    return validated(cls, {**data, **(overrides or {})}, where)
