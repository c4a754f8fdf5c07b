"""The scheme registry and the scheme-spec syntax.

A scheme spec is one or more parts joined by ``+``, each ``NAME`` or
``NAME:key=value[,key=value]``: ``rope:rope_theta=500000``,
``acc-rand-qkv:a=0.3+alibi``. Specs joined by ``|`` are a per-layer pattern,
repeated over the layers: ``rope|rope|rope|nope`` (alias ``irope``). Any part may also set its layer's
``window`` or ``chunk`` (``LAYER_OPTIONS``, ``posenc.encodings.windows``):
``rope:rope_theta=10000,window=1024``. ``NAME`` is a registered scheme or an alias (a
scheme with preset parameters, e.g. ``acc-rand-qkv``, or a named composition,
e.g. ``hybrid``). ``parts(spec)`` parses and validates a spec; building it is
``posenc.encodings.get``.

Schemes from outside posenc (plugins) are loaded when the registry is first used
(``names``, ``catalogue``, ``resolve``, ``parts``, ``layer_pattern``): every entry point of
the group ``posenc.schemes`` (``myscheme = mypkg.schemes``, a module that registers its
schemes, or ``mypkg.schemes:MyScheme``, an Encoding class, registered if it is not yet),
then every module of the environment variable ``POSENC_IMPORT`` (comma-separated module
names or ``.py`` paths). ``import_schemes`` (``posenc --import``) imports one now and adds
it to ``POSENC_IMPORT``, so processes started afterwards (compare's jobs, torchrun) load it too.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import math
import os
import re
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from posenc.encodings.base import Encoding
from posenc.errors import PosencError, one_line

_REGISTRY: dict[str, type[Encoding]] = {}


@dataclass(frozen=True)
class Alias:
    """A name for a spec (``alias``): ``spec`` (a scheme, a composition or a per-layer pattern) with preset ``params``;
    ``doc`` and ``source`` as ``posenc list`` shows them; ``takes``: the parameters besides ``LAYER_OPTIONS`` that a
    named pattern's spec may set on the entries that set them."""

    spec: str
    params: dict[str, Any]
    doc: str
    source: str = ""
    takes: tuple[str, ...] = ()


_ALIASES: dict[str, Alias] = {}
ENTRY_POINTS = "posenc.schemes"
IMPORT_VAR = "POSENC_IMPORT"
_PLUGINS: set[str] = set()  # modules loaded as plugins: a job process loads them itself (entry points, POSENC_IMPORT)
_plugins_loaded = False
# what any part of a spec may set besides its scheme's own parameters: its layer's attention span
# (posenc.encodings.windows), not a constructor parameter
LAYER_OPTIONS = ("window", "chunk")


# each capability flag and the hook it declares (Encoding's docstring): a flag says the hook gives a value
FLAG_HOOKS = {"rotary": "phases", "has_bias": "bias", "replaces_attention": "attend", "has_logits": "logits"}


def check_capabilities(cls: type[Encoding]) -> None:
    """PosencError unless each capability flag of ``cls`` agrees with its hook: a hook implemented under a flag
    left False would be used by some paths and skipped by others (decoding reads the flags), a flag set
    without its hook gives None where a value is promised. A flag in ``cls.instance_flags`` is set by the
    constructor (its hook returns None while it is unset) and is exempt while False."""
    for flag, hook in FLAG_HOOKS.items():
        implemented = getattr(cls, hook) is not getattr(Encoding, hook)
        declared = bool(getattr(cls, flag))
        if implemented and not declared and flag not in cls.instance_flags:
            raise PosencError(
                f"scheme {cls.name!r} implements {hook}() but declares {flag} = False: set {flag} = True "
                f"(or list it in instance_flags when the constructor sets it)"
            )
        if declared and not implemented:
            raise PosencError(f"scheme {cls.name!r} declares {flag} = True but does not implement {hook}()")


def register(cls: type[Encoding]) -> type[Encoding]:
    """Class decorator: make a scheme available by its ``name``; PosencError if the name is taken or its
    capability flags disagree with the hooks it implements (``check_capabilities``)."""
    _check_free(cls.name)
    check_capabilities(cls)
    _REGISTRY[cls.name] = cls
    return cls


def alias(name: str, spec: str, doc: str, source: str = "", takes: tuple[str, ...] = (), **params: Any) -> None:
    """Register ``name`` as ``spec`` (a scheme, a composition ``A+B`` or a per-layer pattern ``A|B``) with preset
    parameters. ``source``: where it comes from (the paper or model, as ``Encoding.source``); "" for an alias of one
    scheme, which has its scheme's. ``takes``: the parameters besides ``LAYER_OPTIONS`` that a pattern's spec may
    set, on the entries that set them (``gemma3:factor=8``)."""
    _check_free(name)
    _ALIASES[name] = Alias(spec, params, doc, source, takes)


def _alias_target(name: str) -> str:
    """The spec the alias ``name`` stands for; "" for a registered scheme or an unknown name."""
    return _ALIASES[name].spec if name in _ALIASES else ""


def unregister(name: str) -> None:
    """Remove a scheme or alias (for schemes registered by a test or a notebook); KeyError if unknown."""
    if name in _REGISTRY:
        del _REGISTRY[name]
    else:
        del _ALIASES[name]


def _check_free(name: str) -> None:
    if name in _REGISTRY or name in _ALIASES:
        raise PosencError(f"scheme name {name!r} is already registered")


def _is_file(target: str) -> bool:
    """Whether ``--import`` names a file (a path, or an existing file such as ``notes.txt``), not a module name."""
    return target.endswith(".py") or os.sep in target or Path(target).is_file()


def _import(target: str) -> str:
    """Import a module name or a ``.py`` path; its module name. A file inside a package (its folders hold
    ``__init__.py``) is imported under its dotted name with the package's parent on ``sys.path``, so that it can
    import its package's other modules (``experiments/accumulated/claims.py`` as ``experiments.accumulated.claims``);
    a loose file as the module named by its stem. PosencError if it fails."""
    if not _is_file(target):
        return _import_module(target, target)
    path = Path(target).resolve()
    if path.is_dir():
        raise PosencError(f"cannot import {target!r}: is a directory")
    if not path.is_file():
        raise PosencError(f"cannot import {target!r}: no such file")
    if path.suffix != ".py":
        raise PosencError(f"cannot import {target!r}: not a .py file or module name")
    root, name = _package_root(path)
    if name in sys.modules:  # imported already (--import, then POSENC_IMPORT), or another module of that name
        _check_file(sys.modules[name], path, target)
    elif "." in name:
        if str(root) not in sys.path:
            sys.path.append(str(root))  # last: the folder must not shadow installed modules
        _import_module(name, target)
        _check_file(sys.modules[name], path, target)
    else:
        _exec_file(name, path, target)
    _PLUGINS.add(name)
    return name


def _check_file(module, path: Path, target: str) -> None:
    if Path(getattr(module, "__file__", None) or "").resolve() != path:
        raise PosencError(f"cannot import {target!r}: a module named {module.__name__!r} is imported already")


def _exec_file(name: str, path: Path, target: str) -> None:
    """Run the loose file ``path`` as the module ``name`` (nothing added to sys.path)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None  # a .py file always has one
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it, as the import system does (dataclasses and pickle look it up)
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:
        del sys.modules[name]
        raise PosencError(f"cannot import {target!r}: {_why(exc)}") from exc


def _why(exc: BaseException) -> str:
    """Why an import failed, in one line: a module that exits on import (``sys.exit``) is a failed import too."""
    return f"it called sys.exit({exc.code!r})" if isinstance(exc, SystemExit) else one_line(exc)


def _package_root(path: Path) -> tuple[Path, str]:
    """(folder to put on sys.path, dotted module name) of the ``.py`` file ``path``."""
    parts, folder = [path.stem], path.parent
    while (folder / "__init__.py").is_file() and folder.parent != folder:
        parts.insert(0, folder.name)
        folder = folder.parent
    return folder, ".".join(parts)


def _import_module(name: str, target: str) -> str:
    try:
        importlib.import_module(name)
    except (Exception, SystemExit) as exc:
        raise PosencError(f"cannot import {target!r}: {_why(exc)}") from exc
    _PLUGINS.add(name)
    return name


def import_schemes(target: str) -> str:
    """Import ``target``, a module name or a path to a ``.py`` file, for the schemes it registers; the module's name.

    It joins ``POSENC_IMPORT`` (a file by its absolute path), so the processes started afterwards
    import it too. PosencError (one line) if the file is missing or the import raises.
    """
    name = _import(target)
    entry = str(Path(target).resolve()) if _is_file(target) else target
    listed = _env_targets()
    if entry not in listed:
        os.environ[IMPORT_VAR] = ",".join([*listed, entry])
    return name


def _env_targets() -> list[str]:
    return [t.strip() for t in os.environ.get(IMPORT_VAR, "").split(",") if t.strip()]


def _load_plugins() -> None:
    """The entry points of ``posenc.schemes``, then the modules of ``POSENC_IMPORT``; once per process."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True  # first: a plugin may use the registry while it loads
    for ep in importlib.metadata.entry_points(group=ENTRY_POINTS):
        try:
            obj = ep.load()
            if isinstance(obj, type) and issubclass(obj, Encoding) and _REGISTRY.get(obj.name) is not obj:
                register(obj)
        except Exception as exc:
            raise PosencError(f"scheme plugin {ep.name!r} ({ep.value}) failed to load: {one_line(exc)}") from exc
        _PLUGINS.add(ep.module)
    for target in _env_targets():
        _import(target)


def plugin_modules() -> set[str]:
    """Names of the modules loaded as plugins: a process loads them on its own when it first uses the registry."""
    _load_plugins()
    return set(_PLUGINS)


def plugin_sources(spec: str) -> list[dict[str, str]]:
    """The plugins a scheme spec needs: {module, file} of each plugin module defining one of its parts (a run
    records them, so that loading it elsewhere can name what to ``--import``)."""
    mods = {cls.__module__ for entry in layer_pattern(spec) for cls, _ in parts(entry)} & plugin_modules()
    return [{"module": m, "file": str(getattr(sys.modules.get(m), "__file__", "") or "")} for m in sorted(mods)]


def names() -> list[str]:
    """All registered schemes and aliases, sorted."""
    _load_plugins()
    return sorted(set(_REGISTRY) | set(_ALIASES))


def catalogue() -> dict[str, list[tuple[str, str, str]]]:
    """Every scheme and alias by family: {family: [(name, first docstring line or alias doc, source)]}.

    An alias is in its target's family and has its own source (``alias``), else its target's; named compositions
    and per-layer patterns form their own families.
    """
    _load_plugins()
    out: dict[str, list[tuple[str, str, str]]] = {}
    for name, cls in _REGISTRY.items():
        out.setdefault(cls.family, []).append((name, (cls.__doc__ or "").strip().splitlines()[0], cls.source))
    for name, a in _ALIASES.items():
        target = a.spec
        family = "per-layer mixes" if "|" in target else "compositions" if "+" in target else _REGISTRY[target].family
        source = a.source or (_REGISTRY[target].source if target in _REGISTRY else "")
        shown = f"{a.doc} (= {target}{' ' + str(a.params) if a.params else ''})"
        out.setdefault(family, []).append((name, shown, source))
    return {f: sorted(rows) for f, rows in sorted(out.items())}


def alias_of(name: str) -> tuple[str, dict[str, Any]] | None:
    """(spec, preset parameters) that the alias ``name`` stands for; None for a registered scheme or an unknown name."""
    _load_plugins()
    return (_ALIASES[name].spec, dict(_ALIASES[name].params)) if name in _ALIASES else None


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


def split_part(part: str, kind: str = "scheme") -> tuple[str, dict[str, Any]]:
    """``NAME:k=v,k=v`` -> (NAME, {k: v}); PosencError naming a ``kind`` spec (scheme, task, method) if malformed
    or not a str (``check_spec``)."""
    check_spec(part, kind)
    if any(c.isspace() for c in part):
        raise PosencError(f"{kind} spec {part!r} contains whitespace")
    name, colon, args = part.partition(":")
    if colon and not args:  # "rope:" would silently mean "rope"
        raise PosencError(f"{kind} spec {part!r}: empty parameter list after ':' (give key=value, or drop the ':')")
    if "=" in name:  # a YAML flow list [a:x=1,y=2] splits at the comma
        raise PosencError(f"{kind} spec {part!r} has no {kind} name (quote specs with ',' in YAML lists)")
    params: dict[str, Any] = {}
    for item in args.split(",") if args else ():
        key, eq, val = item.partition("=")
        if not eq or not key or not val:
            raise PosencError(f"{kind} spec {part!r}: expected key=value, got {item!r}")
        if key in params:
            raise PosencError(f"{kind} spec {part!r}: duplicate key {key!r}")
        params[key] = _value(val)
    if not name:
        raise PosencError(f"{kind} spec {part!r}: missing {kind} name")
    return name, params


def check_spec(spec: Any, kind: str = "scheme") -> None:
    """PosencError (one line) unless ``spec`` is a str: what every reading of a ``kind`` spec (scheme, method,
    task) checks first."""
    if not isinstance(spec, str):
        hint = " (see `posenc list`)" if kind == "scheme" else ""
        raise PosencError(f"a {kind} spec is a string{hint}, got {type(spec).__name__} {spec!r}")


def _split_spec(spec: str) -> list[str]:
    """The parts of ``A+B``: a ``+`` starts a part only before a letter (``a=1e+3`` stays whole);
    PosencError for a spec that is not a str (``check_spec``) or an empty part (``rope+``, ``+rope``,
    ``rope++alibi``)."""
    check_spec(spec)
    split = re.split(r"\+(?=[A-Za-z]|\+|$)", spec)
    for i, part in enumerate(split):
        if not part and len(split) > 1:
            raise PosencError(f"scheme spec {spec!r}: the part {'after' if i else 'before'} '+' is empty")
    return split


def format_part(name: str, params: dict[str, Any]) -> str:
    """The spec ``NAME:k=v,k=v`` of one part (the inverse of ``split_part``): bools as true/false."""
    text = ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in params.items())
    return f"{name}:{text}" if text else name


class Parameter(NamedTuple):
    """A parameter a scheme spec may set: its default (None: the scheme picks, as ``doc`` says), the
    constructor's annotation, and one line of meaning and range from the scheme's docstring."""

    name: str
    default: Any
    type: str
    doc: str


def param_docs(cls: type[Encoding]) -> dict[str, str]:
    """{parameter: meaning} from the ``Parameters:`` section of ``cls``'s own docstring: a line ``Parameters:``,
    then one ``name: meaning`` line per parameter (deeper-indented lines continue it), up to a blank line."""
    lines = inspect.cleandoc(cls.__doc__ or "").splitlines()
    if "Parameters:" not in lines:
        return {}
    out: dict[str, str] = {}
    key, indent = "", 0
    for line in lines[lines.index("Parameters:") + 1 :]:
        if not line.strip():
            break
        if key and len(line) - len(line.lstrip()) > indent:
            out[key] += " " + line.strip()
        else:
            indent = len(line) - len(line.lstrip())
            key, _, out[key] = line.strip().partition(": ")
    return out


def parameters(name: str) -> list[Parameter]:
    """The parameters a spec of ``name`` may set, in the constructor's order: defaults and annotations from
    the constructor, meanings from ``param_docs`` ("" where the scheme documents none). An alias has its
    scheme's parameters but those it fixes; a composition or a per-layer pattern none (its parts have them).
    PosencError for an unknown name."""
    if len(layer_pattern(name)) > 1 or len(parts(name)) > 1:
        return []
    cls, fixed = resolve(name)
    docs = param_docs(cls)
    return [
        Parameter(p.name, None if p.default is p.empty else p.default, str(p.annotation), docs.get(p.name, ""))
        for p in inspect.signature(cls.__init__).parameters.values()
        if p.name in _settable(cls, fixed)
    ]


def _accepted(cls: type[Encoding]) -> set[str]:
    return set(inspect.signature(cls.__init__).parameters) - {"self", "dims"}


def _settable(cls: type[Encoding], fixed) -> set[str]:
    """What a spec may set: the constructor's parameters but the internal ones and those an alias fixes."""
    return _accepted(cls) - set(cls.internal) - set(fixed)


def check_types(name: str, cls: type[Encoding], params: dict[str, Any]) -> None:
    """Each value against the constructor's annotation (bool, int, float, str, dict); PosencError naming the key.
    A dict's entries, and values of other annotations, are the constructor's to check."""
    hints = typing.get_type_hints(cls.__init__)
    for key, value in params.items():
        want = {t for t in typing.get_args(hints.get(key)) or (hints.get(key),) if t in (bool, int, float, str, dict)}
        ok = (
            (bool in want and isinstance(value, bool))
            or (int in want and isinstance(value, int) and not isinstance(value, bool))
            or (
                float in want
                and isinstance(value, (int, float))
                and not isinstance(value, bool)
                and math.isfinite(value)
            )
            or (str in want and isinstance(value, str))
            or (dict in want and isinstance(value, dict))
            or not want
        )
        if not ok and isinstance(value, float) and not math.isfinite(value) and float in want:
            raise PosencError(f"scheme {name!r}: {key}={value!r}: must be a finite number")
        if not ok:
            raise PosencError(
                f"scheme {name!r}: {key}={value!r}: expected {' or '.join(sorted(t.__name__ for t in want))}"
            )


def resolve(name: str, params: dict[str, Any] | None = None) -> tuple[type[Encoding], dict[str, Any]]:
    """Scheme class and merged parameters of one part (``NAME`` or ``NAME:k=v``, not a composition).

    Raises PosencError for an unknown name, a parameter the scheme does not take, or one it takes but
    ignores under the other settings (``Encoding.applies_to``; ``params`` count as set by the user); value
    types are checked where the scheme is built (``posenc.encodings.get``).
    """
    _load_plugins()
    base, own = split_part(name)
    params = {**own, **(params or {})}
    name, aliased = base, set()
    while name in _ALIASES:
        target, preset = _ALIASES[name].spec, _ALIASES[name].params
        aliased |= set(preset)
        if "|" in target:  # gemma3+alibi: a part names a whole model's layers
            raise PosencError(
                f"{base!r} is a per-layer pattern ({target}), not one layer's scheme: it cannot be a part of a "
                "composition (write the pattern's entries with the part added to each)"
            )
        if "+" in target:
            raise PosencError(f"{base!r} is a composition ({target}); give parameters to its parts")
        fixed = sorted(set(own) & set(preset))
        if fixed:  # acc-rand-qkv:mode=token would train another scheme under this name
            raise PosencError(
                f"{base!r} fixes {', '.join(f'{k}={preset[k]!r}' for k in fixed)}; "
                f"use {target!r} with the parameters you want"
            )
        name, params = target, {**preset, **params}
    if name not in _REGISTRY:
        raise PosencError(f"unknown scheme {base!r}; valid: {', '.join(names())}")
    cls = _REGISTRY[name]
    internal = sorted(set(own) & set(cls.internal))
    if internal:
        raise PosencError(f"scheme {base!r}: {', '.join(internal)} cannot be set in a spec")
    unknown = sorted(set(params) - _accepted(cls) - set(LAYER_OPTIONS))
    own_params = {k: v for k, v in params.items() if k not in unknown and k not in LAYER_OPTIONS}
    ignored = cls.applies_to({**constructor_defaults(cls), **own_params})
    if unknown:
        valid = sorted(_settable(cls, aliased) - set(ignored))
        raise PosencError(
            f"scheme {base!r} has no parameter {', '.join(map(repr, unknown))}; valid: {', '.join(valid) or 'none'}"
        )
    explicit = sorted((set(params) - aliased) & set(ignored))
    if explicit:  # acc-rand-qkv:rope_theta=500 would train what acc-rand-qkv trains under another name
        key = explicit[0]
        raise PosencError(f"scheme {base!r}: {key} applies to {ignored[key]} only; here it would do nothing")
    return cls, params


def constructor_defaults(cls: type[Encoding]) -> dict[str, Any]:
    """The constructor's parameters that have a default, with it."""
    return {
        k: p.default
        for k, p in inspect.signature(cls.__init__).parameters.items()
        if p.default is not inspect.Parameter.empty
    }


def layer_pattern(spec: str) -> list[str]:
    """The per-layer specs of ``spec``: ``A|B|C`` gives layer i the spec at i mod 3 (iRoPE-style
    NoPE layers: ``rope|rope|rope|nope``); a named pattern (``irope``) is expanded; any other
    spec is one entry, used by every layer. A named pattern takes the ``LAYER_OPTIONS`` its entries set, and the
    parameters it was registered to take (``alias``'s ``takes``), on the entries that set them
    (``gemma3:window=512``: every entry that sets a window gets 512; ``gemma3:factor=8``: the global entry's linear
    RoPE scaling). PosencError for an empty entry, an entry that is itself a named pattern (``gemma3|nope``: an
    entry is one layer's spec, and "layer i takes entry i mod n" would count the named pattern's layers as one) or
    other parameters on a named pattern, or a spec that is not a str (``check_spec``)."""
    check_spec(spec)
    _load_plugins()
    items = spec.split("|")
    if not spec.strip():
        raise PosencError("scheme spec is empty: give a scheme name (posenc list shows them)")
    if any(not item for item in items):
        raise PosencError(f"scheme spec {spec!r}: empty layer entry in a '|' pattern")
    if len(items) > 1:
        for item in items:
            target = _alias_target(split_part(item)[0])
            if "|" in target:
                raise PosencError(
                    f"scheme spec {spec!r}: the entry {item!r} is a per-layer pattern ({target}), not one layer's "
                    "spec: write its entries into the pattern"
                )
        return items
    base, params = split_part(spec)
    target = _alias_target(base)
    if "|" not in target:
        return [spec]
    entries = layer_pattern(target)
    return [_with_options(entry, params, base, target) for entry in entries] if params else entries


def check_layer_count(spec: str, n_layer: int) -> None:
    """PosencError (one line) when ``spec`` is a per-layer pattern (``layer_pattern``) of more entries than a model of
    ``n_layer`` layers has: layer i takes entry i mod n, so the entries past the last layer would never be used
    (``gemma3`` on 2 layers would have no global layer). A shorter pattern repeats, also where n does not divide
    ``n_layer`` (Gemma 3 1B: 26 layers of a 6-layer pattern). Every model checks it: ``posenc.model.LM``,
    ``ModelConfig.check_encoding``, ``posenc.hf.scheme.apply_scheme``."""
    entries = len(layer_pattern(spec))
    if entries > n_layer:
        raise PosencError(
            f"scheme {spec!r} is a pattern of {entries} layer entries for a model of {n_layer} layers: the entries "
            f"past layer {n_layer} would never be used; give at most {n_layer} entries, or more layers"
        )


def _with_options(entry: str, options: dict[str, Any], base: str, target: str) -> str:
    """``entry`` of the named pattern ``base`` (= ``target``) with each of ``options`` replacing the value its parts
    set (``gemma3:window=512``); PosencError for a key that is not a layer option or that no entry of the
    pattern sets."""
    set_by_entries = {k for part in _split_spec(target.replace("|", "+")) for k in split_part(part)[1]}
    settable = set(LAYER_OPTIONS) | set(_ALIASES[base].takes)
    bad = sorted(k for k in options if k not in settable or k not in set_by_entries)
    if bad:
        takes = sorted(settable & set_by_entries)
        raise PosencError(
            f"{base!r} is a per-layer pattern ({target}); give parameters to its entries"
            + (f" (it takes {', '.join(takes)}, for the entries that set it)" if takes else "")
        )
    parts = [split_part(part) for part in _split_spec(entry)]
    return "+".join(format_part(name, {k: options.get(k, v) for k, v in p.items()}) for name, p in parts)


def parts(spec: str) -> list[tuple[type[Encoding], dict[str, Any]]]:
    """(class, parameters) of every part of ``spec``, named compositions expanded; PosencError if invalid."""
    _load_plugins()
    out = []
    for part in _split_spec(spec):
        base, params = split_part(part)
        target = _alias_target(base)
        if "+" in target and not params:
            out += parts(target)
        else:
            out.append(resolve(part))
    return out


def canonical(spec: str) -> str:
    """What makes two spellings one scheme: per layer entry, each part's class and parameters with the
    constructor's defaults filled in (``rope`` and ``rope:rope_theta=10000``, ``hybrid`` and
    ``acc-learned-qkv+forget`` are one key). A label that is not a spec (``rope+yarn(s=8)``) is its own key."""
    try:
        entries = []
        for entry in layer_pattern(spec):
            entry_parts = []
            for cls, params in parts(entry):
                defaults = constructor_defaults(cls)
                merged = {
                    k: float(v) if isinstance(v, int) and not isinstance(v, bool) else v
                    for k, v in cls.effective({**defaults, **params}).items()
                }
                entry_parts.append((cls.__name__, sorted(merged.items())))  # 10000 and 10000.0 are one value
            entries.append(entry_parts)
        return repr(entries)
    except PosencError:
        return spec
