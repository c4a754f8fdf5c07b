"""The subcommands of ``posenc`` (``posenc.cli.main`` lists them), and what their parsers share."""

import argparse
import json
import math
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from posenc.errors import PosencError
from posenc.store.presets import parse_set
from posenc.store.stamp import WeightsDtype


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


def once(flag: str, values: list) -> None:
    """PosencError naming ``flag`` and the values it repeats (a length given twice is scored, and shown, twice)."""
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        raise PosencError(f"{flag} repeats {', '.join(map(str, repeated))}: give each once")


def add_set(p, example: str) -> None:
    """The ``--set KEY=VALUE`` option of a command that takes ``--preset``."""
    p.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"set any key of the preset (docs/presets.md), the value read as YAML, e.g. {example}; repeatable, "
        "the last given wins (a flag's key given another value by --set is refused); a finished run's settings cannot "
        "be changed",
    )


def given_settings(args, flags: dict[str, str], derived: dict[str, Any] | None = None) -> dict[str, Any]:
    """The settings a command line gives, as preset overrides {dotted key: value} (``posenc.store.presets.apply``):
    each flag given (``flags``: {argparse dest: the preset key it sets}) as ``--set key=value`` would, then the
    ``derived`` settings (those a flag implies, or gives in another form), then each ``--set`` (so the last given wins).
    PosencError for a malformed ``--set``, or one that gives a flag's key another value than the flag."""
    out = {key: getattr(args, dest) for dest, key in flags.items() if getattr(args, dest) is not None}
    sets = list(map(parse_set, args.sets))
    for key, value in sets:  # a flag and a --set of its key that disagree: the flag lost without a word
        dest = next((d for d, k in flags.items() if k == key and key in out), None)
        if dest is not None and out[key] != value:
            raise PosencError(f"--{dest.replace('_', '-')} {out[key]} and --set {key}={value} disagree: give one")
    for key, value in [*(derived or {}).items(), *sets]:
        out.pop(key, None)  # re-inserted last: the order they apply in is the command line's
        out[key] = value
    return out


def add_dry_run(p, what: str) -> None:
    """The ``--dry-run`` option of a command that runs jobs (``what``: what it would do, for the help)."""
    p.add_argument(
        "--dry-run",
        action="store_true",
        help=f"print the resolved settings (YAML) and the job count, then exit without {what}; bad settings "
        "fail as they would in a run",
    )


def print_dry_run(command: str, settings: dict[str, Any], jobs: int, detail: str) -> int:
    """``--dry-run``'s output on stdout, as one YAML document: a comment naming ``command``, the resolved
    ``settings`` (JSON values: paths and tuples as JSON writes them), then ``jobs: N`` with ``detail`` (what the
    jobs are) as its comment. Returns 0, the exit code."""
    plain = json.loads(json.dumps(settings, default=str))
    print(f"# {command} --dry-run: the resolved settings; nothing is trained, loaded or written")
    print(yaml.safe_dump(plain, sort_keys=False, default_flow_style=False), end="")
    print(f"jobs: {jobs}  # {detail}")
    return 0


def refuse_derived_settings(settings: dict[str, Any], command: str, flag: str) -> None:
    """PosencError when ``settings`` (``given_settings``) set a model key that ``command`` derives and would replace
    without a word: model.encoding (from ``flag``) and model.vocab_size (from the tokenizer or the task)."""
    model = settings.get("model")
    derived = {
        "encoding": f"{command} takes the scheme from {flag}: give it there, not as",
        "vocab_size": "the vocabulary comes from the tokenizer (train.tokenizer) or the task: set that, not",
    }
    for key, why in derived.items():
        if f"model.{key}" in settings or (isinstance(model, dict) and key in model):
            raise PosencError(f"{why} --set model.{key}")


def nonblank(convert: Callable[[str], Any] = str) -> Callable[[str], Any]:
    """An argparse ``type`` for a flag whose value must not be blank (``Path("")`` is the current directory, and an
    empty corpus, model or device name fell back to a default): the value converted, or argparse's one-line error
    (exit 2)."""

    def parse(text: str) -> Any:
        if not text.strip():
            raise argparse.ArgumentTypeError("is empty")
        return convert(text)

    parse.__name__ = getattr(convert, "__name__", "value")  # argparse names the type in its other errors
    return parse


OUT = nonblank(Path)  # every command's --out


def add_dtype(p, default: str | None = "float32", note: str = "") -> None:
    """``--dtype``: a pretrained model's weights' and compute's dtype (``posenc.store.stamp.WeightsDtype``);
    ``default`` None leaves it to the preset (whose default is float32); ``note`` is appended to the help."""
    p.add_argument(
        "--dtype",
        choices=typing.get_args(WeightsDtype),
        default=default,
        help="a pretrained model's weights' and compute's dtype; auto: bfloat16 where the CPU has bf16 units "
        f"(default {default or 'float32'}; positions and angles stay float32){note}",
    )
