"""Presets as data: YAML files shipped as package data (``posenc/presets/``, read with
``importlib.resources`` so an installed wheel has them) or given by path, validated by a pydantic
model into a one-line error. compare (``posenc.config.plan``), extend, finetune and theory read theirs here.

One dialect for all of them: a preset may say ``base: NAME`` (another preset, by name or path) and
gives only what differs (:func:`merge`); the command line sets any key with ``--set KEY=VALUE``
(:func:`parse_set`, :func:`assign`); :func:`reference` documents a preset's keys from its models.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import re
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Union

import yaml
from pydantic import BaseModel, Field, TypeAdapter, ValidationError
from pydantic_core import PydanticUndefined

from posenc.errors import PosencError

# a run's seed: numpy's generators take no negative one, and the model's draws are int32 counters (ModelConfig.seed)
Seed = Annotated[int, Field(ge=0, lt=2**31)]
# the most optimiser steps a run takes, and the bound of every step count (warmup, checkpoint and log intervals):
# a scheme that draws per training step counts its draws in [0, 2^31), the last value kept for evaluation
# (posenc.encodings.draw, posenc.encodings.accumulated.EVAL_DRAW); 10^20 steps ran at a schedule that long until killed
MAX_STEPS = 2**31 - 1
Steps = Annotated[int, Field(gt=0, le=MAX_STEPS)]  # a step count or interval, > 0
StepCount = Annotated[int, Field(ge=0, le=MAX_STEPS)]  # one that may be 0 (warmup)
# the most of every other count a setting gives (evaluation trials, windows, answers, keys per trial, tokens per
# length or batch): as many as steps, past any run's by orders of magnitude; eval.passkey.trials=10^20 was taken, and
# would have run until killed
MAX_COUNT = 2**31 - 1
Count = Annotated[int, Field(gt=0, le=MAX_COUNT)]  # a count, > 0
CountOrOff = Annotated[int, Field(ge=0, le=MAX_COUNT)]  # one whose 0 switches the pass off (or means all)
# torch CPU threads: torch.set_num_threads takes a C int (10^20 raised "Overflow when unpacking long long"), but OpenMP
# allocates each thread's state at the first parallel op (2^31 - 1 aborted it: "Out of memory allocating 463856469096
# bytes"); 1024 is more than any CPU has cores
MAX_THREADS = 1024
Threads = Annotated[int, Field(gt=0, le=MAX_THREADS)]
SHIPPED = importlib.resources.files("posenc") / "presets"  # package data: works from a wheel too


_REGISTERED: list[Path] = []  # compare-preset folders of studies (experiments/<name>/presets), by register_presets


def register_presets(folder: Path) -> None:
    """Let the presets in ``folder`` (an experiment's, outside the library) load by name beside the shipped ones,
    as its module does when ``posenc --import`` loads it; a shipped name wins."""
    if Path(folder) not in _REGISTERED:
        _REGISTERED.append(Path(folder))


def distinct(v: list, key=str) -> list:
    """``v`` unchanged; ValueError naming the entries that repeat (by ``key``): a repeat would run once and be
    reported as if it were two (a length scored twice shows a spread of 0 over one seed)."""
    keys = [key(x) for x in v]
    repeated = sorted({str(x) for x, k in zip(v, keys) if keys.count(k) > 1})
    if repeated:
        raise ValueError(f"each entry once: {', '.join(repeated)} repeated" + ("" if key is str else " (one spec)"))
    return v


def _folders(folder) -> list:
    """Where a preset name is looked up: ``folder``, and for compare's shipped folder the registered ones after it."""
    return [folder, *_REGISTERED] if folder is SHIPPED else [folder]


def preset_names(folder=SHIPPED) -> list[str]:
    """The presets shipped in ``folder`` (package data), and for compare's the registered studies' too."""
    return sorted(
        {p.name.removesuffix(".yaml") for f in _folders(folder) for p in f.iterdir() if p.name.endswith(".yaml")}
    )


class Loader(yaml.SafeLoader):
    """YAML as presets read it: PyYAML's safe loader with the scalars of YAML 1.2's core schema, and a key given
    twice in one mapping an error (YAML 1.2 forbids it; PyYAML would keep the last silently). PyYAML reads YAML
    1.1, where ``on`` / ``no`` are booleans, ``010`` is 8, ``1:30`` is 90 and ``3e-3`` a string: each a setting
    silently other than typed. Here only ``true`` / ``false`` are booleans, an integer is decimal unless it says
    ``0o`` / ``0x``, and ``3e-3`` is a float."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, str | int | float | bool) and key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping",
                    node.start_mark,
                    f"key {key!r} given twice (first at line {seen[key].line + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node):
        text = self.construct_scalar(node)
        return int(text, 0) if text.lstrip("+-")[:2] in ("0o", "0x") else int(text, 10)


# YAML 1.2 core schema (yaml.org/spec/1.2.2, 10.3.2) in place of PyYAML's 1.1 resolvers for booleans and numbers
_CORE = {"tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"}
Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in rules if tag not in _CORE]
    for first, rules in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789")
)
Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)
Loader.add_constructor("tag:yaml.org,2002:int", Loader.construct_yaml_int)


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error in one line with its place: ``line L, column C: <problem>`` (1-based, PyYAML's problem mark),
    followed by what was being read and where it began when PyYAML says; the error's first line when it has no mark."""
    mark, problem = getattr(exc, "problem_mark", None), getattr(exc, "problem", None)
    if mark is None or problem is None:
        return str(exc).splitlines()[0]
    line = f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    context, begun = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and begun is not None:
        line += f" ({context} at line {begun.line + 1}, column {begun.column + 1})"
    return line


OWN = ("name", "description")  # what each preset says of itself: never taken from its base


def read_preset(
    name_or_path: str, folder=SHIPPED, kind: str = "preset", cls: type | None = None, _chain: tuple[str, ...] = ()
) -> tuple[Path, dict]:
    """(path, settings) of preset ``name_or_path``: a name in ``folder`` or a YAML file's path (any extension),
    with its ``base`` resolved: the base preset (a name in ``folder``, or a path relative to this file's folder),
    itself resolved, under this file's settings merged by :func:`merge` over ``cls``'s sections (every key but
    ``OWN``'s is taken from the base unless given here).

    Raises PosencError (one line, naming the ``kind``) for an unknown preset, a path that is no regular file (a
    directory, a device such as /dev/null, a broken link: each said), invalid YAML, a file that is not a mapping of
    settings, a ``base`` that is not a name or path, and a cycle of bases.
    """
    path = Path(name_or_path)
    shipped = next(
        (f / f"{name_or_path}.yaml" for f in _folders(folder) if (f / f"{name_or_path}.yaml").is_file()),
        folder / f"{name_or_path}.yaml",
    )
    bare = not path.suffix and path.name == name_or_path  # "quick"; "./mypreset" and "my.yaml" are paths
    if bare and (shipped.is_file() or not path.is_file()):  # a shipped name wins over a stray local file
        path = shipped
    if not path.is_file():
        valid = ", ".join(preset_names(folder))
        if bare:
            studies = " (a study's presets load once posenc --import loads its module)" if folder is SHIPPED else ""
            raise PosencError(f"unknown {kind} {name_or_path!r}; valid: {valid}{studies}")
        if path.is_dir():
            what = "is a directory, not a YAML file"
        elif path.exists():  # /dev/null, a FIFO (reading one would block): there, but no file of settings
            what = "is not a regular file (a device, FIFO or socket), not a YAML file"
        elif path.is_symlink():  # exists() follows the link
            what = "is a broken symbolic link"
        else:
            what = "does not exist"
        raise PosencError(f"{kind} file {name_or_path} {what} (shipped {kind}s: {valid})")
    if str(path) in _chain:
        names = [Path(p).name for p in (*_chain[_chain.index(str(path)) :], str(path))]
        raise PosencError(f"{kind} {names[0]}: its bases form a cycle ({' -> '.join(names)})")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader)
    except yaml.YAMLError as exc:
        raise PosencError(f"{kind} {path} is not valid YAML: {yaml_problem(exc)}") from None
    except UnicodeDecodeError:
        raise PosencError(f"{kind} {path} is not UTF-8 text") from None
    if data is None:  # validation would name the first required key as if one were missing
        raise PosencError(f"{kind} {path} is empty: it needs its settings (docs/presets.md)")
    if not isinstance(data, dict):
        raise PosencError(f"{kind} {path} is not a YAML mapping of settings")
    if "base" not in data:
        return path, data
    base = data.pop("base")
    if not isinstance(base, str) or not base.strip():
        raise PosencError(f"{kind} {path.name}: base must be a preset's name or path, got {base!r}")
    relative = base if Path(base).name == base and not Path(base).suffix else str(Path(path).parent / base)
    try:
        _, inherited = read_preset(relative, folder, kind, cls, (*_chain, str(path)))
    except PosencError as exc:  # name the file whose base it is: the user may not know the chain
        if "its bases form a cycle" in str(exc) or " (base of " in str(exc):  # named already
            raise
        raise PosencError(f"{exc} (base of {path})") from None
    return path, merge(cls, {k: v for k, v in inherited.items() if k not in OWN}, data)


def merge(cls: type | None, data: dict, over: dict) -> dict:
    """``over``'s settings over ``data``'s (a new dict; neither is changed): a key naming a section of ``cls`` (a
    pydantic model or dataclass field, ``train``, ``eval.passkey``) given a mapping merges key by key; any other
    value (a scalar, a list, null, a free mapping such as ``sweep.grid`` or ``model.encoding_params``) replaces
    the one in ``data`` whole."""
    out, fields = dict(data), _fields(cls)
    for key, value in over.items():
        section = _section(fields.get(key))
        if section is not None and isinstance(value, dict):
            value = merge(section, out[key] if isinstance(out.get(key), dict) else {}, value)
        out[key] = value
    return out


def parse_set(text: str) -> tuple[str, Any]:
    """(key, value) of one ``--set KEY=VALUE``: the value read as YAML (a scalar, ``[a, b]``, ``{k: v}``, ``null``).
    PosencError for a text without ``=`` or a value that is not YAML."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise PosencError(f"--set expects KEY=VALUE (train.lr=3e-3), got {text!r}")
    if not raw.strip():  # YAML reads nothing as null: say so rather than "invalid KEY=None"
        raise PosencError(f"--set {key.strip()}= has no value (null is written {key.strip()}=null)")
    try:
        return key.strip(), yaml.load(raw, Loader)
    except yaml.YAMLError as exc:
        raise PosencError(f"--set {key}: {raw!r} is not a YAML value ({str(exc).splitlines()[0]})") from None


def assign(cls: type, data: dict, key: str, value: Any, origin: str) -> dict:
    """``data`` (a new dict) with the setting at dotted ``key`` of ``cls`` set to ``value``: its sections by field
    name (``train.lr``, ``eval.passkey.trials``; a section absent or null starts empty), below a free mapping the
    rest of the key one entry (``sweep.grid.train.lr``); a mapping given for a section merges into it (:func:`merge`).
    PosencError naming ``origin`` (``--set train.lr``) for a key ``cls`` does not have (the valid ones listed) or one
    below a value that takes no keys."""
    path, tp, parts = [], cls, key.split(".")
    while parts:
        fields = _fields(_section(tp))
        if fields:
            name = parts.pop(0)
            if name not in fields:
                where = f"in {'.'.join(path)}" if path else "at the top"
                raise PosencError(f"{origin}: unknown key {name!r} {where} (valid: {', '.join(fields)})")
            path.append(name)
            tp = fields[name]
        elif _is_mapping(tp):
            path.append(".".join(parts))
            tp = Any
            break
        else:
            raise PosencError(f"{origin}: {'.'.join(path)} takes a value, not keys")
    out = dict(data)
    at = out
    for name in path[:-1]:
        at[name] = dict(at[name]) if isinstance(at.get(name), dict) else {}
        at = at[name]
    section = _section(tp)
    at[path[-1]] = merge(section, at.get(path[-1]) or {}, value) if section and isinstance(value, dict) else value
    return out


def _unwrap(tp):
    """``tp`` without Optional[...] and Annotated[...]: the type a setting holds when it is given."""
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp
            tp = args[0]
        else:
            return tp


def _section(tp) -> type | None:
    """The model (pydantic or dataclass) of a setting of type ``tp``, else None (a value or a free mapping)."""
    tp = _unwrap(tp)
    return tp if isinstance(tp, type) and (issubclass(tp, BaseModel) or dataclasses.is_dataclass(tp)) else None


def _fields(cls: type | None) -> dict[str, Any]:
    """{field: type} of a pydantic model or dataclass, in declaration order; {} for anything else."""
    if cls is None:
        return {}
    if issubclass(cls, BaseModel):
        return {name: f.annotation for name, f in cls.model_fields.items()}
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _is_mapping(tp) -> bool:
    tp = _unwrap(tp)
    return tp is Any or tp is dict or typing.get_origin(tp) is dict


def validated(cls: type, data: dict, where: str, overrides: dict[str, Any] | None = None):
    """``cls`` (a pydantic model or a standard-library dataclass such as ``ModelConfig``) built from ``data``; the
    first validation error as one PosencError line naming ``where`` and the field (``config`` for a check of the
    whole object), or naming ``KEY=VALUE (command line)`` when the field is one of ``overrides`` (a flag or ``--set``
    gave it). Validation is strict (no bool as an integer or number, no float as an integer)."""
    try:
        # strict, so a bool is no integer (``steps: true`` is not 1 step) nor a number; from JSON, where strict
        # still reads what YAML has no type for (a list as a tuple, text as a path or a date's text)
        return TypeAdapter(cls).validate_json(json.dumps(data, default=str), strict=True)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(map(str, err["loc"])) or "config"
        if field in (overrides or {}):
            given = overrides[field]  # quoted where YAML would read the text as another type ('10', 'true')
            shown = repr(given) if isinstance(given, str) and yaml.load(given, Loader) != given else given
            raise PosencError(f"invalid {field}={shown} (command line): {err['msg']}") from None
        raise PosencError(f"invalid {where}: {field}: {err['msg']}") from None


def reference(cls: type, key: str = "") -> str:
    """Markdown tables of the settings of ``cls`` (a pydantic model or dataclass; ``key``: where it sits in a
    preset, "" at the top), one per section, each followed by its sections' tables: every key with its type (and
    bounds), its default and its description (the field's docstring, with its unit). How docs/presets.md
    documents the format; a field without a docstring reads "(undocumented)", which its test refuses."""
    title = f"`{key}`" if key else "the top level"
    lines = [f"### {title} ({cls.__name__})", "", "| key | type | default | meaning |", "|---|---|---|---|"]
    below = []
    for name, (tp, meta, default, doc) in _field_infos(cls).items():
        meaning = (doc or "(undocumented)").replace("\n", " ")  # a docstring wrapped to the line width: one cell
        lines.append(
            f"| `{name}` | {_type_name(tp, meta)} | {_default(default)} | "
            f"{meaning.replace('``', '`').replace('|', '/')} |"
        )
        if _section(tp) is not None:
            below.append(reference(_section(tp), f"{key}.{name}" if key else name))
    return "\n\n".join(["\n".join(lines), *below])


def _field_infos(cls: type) -> dict[str, tuple]:
    """{field: (type, constraints, default, description)} of a pydantic model or dataclass (default
    PydanticUndefined when required)."""
    if issubclass(cls, BaseModel):
        return {
            name: (f.annotation, f.metadata, f.get_default(call_default_factory=True), f.description)
            for name, f in cls.model_fields.items()
        }
    docs = TypeAdapter(cls).json_schema()["properties"]
    hints = typing.get_type_hints(cls, include_extras=True)
    out = {}
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        out[f.name] = (
            hints[f.name],
            [],
            PydanticUndefined if default is dataclasses.MISSING else default,
            docs[f.name].get("description"),
        )
    return out


_BOUNDS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}


def _type_name(tp, meta=()) -> str:
    """A setting's type in words: ``integer > 0``, ``list of number >= 0, <= 1``, ``text or null``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return _type_name(args[0], [*args[1:], *meta])
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a, () if a is type(None) else meta) for a in args)
    meta = [*meta, *(m2 for m in meta for m2 in getattr(m, "metadata", ()))]  # a Field(...) inside Annotated
    bounds = [
        f"{op} {getattr(m, attr)}" for m in meta for attr, op in _BOUNDS.items() if getattr(m, attr, None) is not None
    ]
    least = [f" (at least {m.min_length})" for m in meta if getattr(m, "min_length", None)]
    if origin is typing.Literal:
        name = "one of " + ", ".join(f"`{a}`" for a in args)
    elif origin is list:
        name = f"list of {_type_name(args[0])}"
    elif tp is Any:
        name = "any"
    elif origin is dict or tp is dict:
        name = "mapping"
    elif _section(tp) is not None:
        name = "section (below)"
    else:
        name = {type(None): "null", int: "integer", float: "number", str: "text", bool: "true/false"}.get(tp, str(tp))
    return " ".join([name, ", ".join(bounds)]).strip() + "".join(least)


def _default(value) -> str:
    """A default as a preset would write it (YAML flow style); a section's as the keys it sets apart from its own
    defaults, or "its keys' defaults"."""
    if value is PydanticUndefined:
        return "required"
    if isinstance(value, BaseModel) or dataclasses.is_dataclass(value):
        value = value.model_dump(exclude_defaults=True) if isinstance(value, BaseModel) else {}
        if not value:
            return "its keys' defaults"
    return "`" + yaml.safe_dump([value], default_flow_style=True, width=10**6).strip()[1:-1] + "`"


def apply(cls: type, data: dict, overrides: dict[str, Any] | None) -> dict:
    """``data`` with each of ``overrides`` ({dotted key: value}, in order; a section's key given a mapping merges
    it) set by :func:`assign`: how a command's flags and ``--set`` reach a preset."""
    for key, value in (overrides or {}).items():
        data = assign(cls, data, key, value, f"--set {key}")
    return data


def load_flat(cls: type[BaseModel], name_or_path: str, folder, kind: str, overrides: dict | None = None):
    """A preset whose keys are a command's flags: ``cls`` built from preset ``name_or_path`` (a name in
    ``folder`` or a YAML path) with ``overrides`` (the given flags and ``--set``s) replacing its keys
    (:func:`apply`). PosencError as :func:`read_preset`, :func:`assign` and :func:`validated`, naming the ``kind``."""
    path, data = read_preset(name_or_path, folder, kind, cls)
    where = f"{kind} {path.name}" + (" with command-line options" if overrides else "")
    return validated(cls, apply(cls, data, overrides), where, overrides)


def refuse_other_settings(where: Path, old: dict[str, Any], now: dict[str, Any]) -> None:
    """PosencError when ``now``, the settings of a rerun into the run directory ``where``, differ from ``old``, those
    its results were made with (each flat, {key: JSON value}; a key one of them lacks reads as None there): a rerun
    skips what is finished, so mixing settings would label old results with new settings. The one refusal of every
    command that resumes in its output folder (``posenc compare``: ``posenc.jobs.launcher.check_same_settings``;
    ``posenc extend``: ``posenc.jobs.extend.check_same_setting``)."""
    diff = [f"{k} {old.get(k)!r} -> {now.get(k)!r}" for k in dict.fromkeys([*now, *old]) if old.get(k) != now.get(k)]
    if diff:
        raise PosencError(
            f"{where} holds results made with other settings ({'; '.join(diff)}); use another --name or --out"
        )
