"""The ``posenc`` command line: one subcommand per job.

Every subcommand module exposes ``add_parser(subparsers)`` which registers its
parser and sets ``func``; bad input raises :class:`posenc.errors.PosencError`,
printed here as one line with exit code 2; Ctrl-C exits with code 130 (the shell's for SIGINT), SIGTERM
(``timeout``) is handled as Ctrl-C and exits with 143 (128 + 15); output
piped into a reader that stops early (``posenc list | head``) ends quietly with 141 (the shell's for SIGPIPE).
``--quiet`` / ``--verbose`` (before or after the subcommand) set the verbosity of progress on stderr
(``posenc.eval.progress``); results go to stdout. A study outside the library runs a command of its own through
:func:`main`'s ``commands`` (docs/plugins.md), with all of the above.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import signal
import sys
from collections.abc import Callable, Sequence

import torch

import posenc
from posenc import encodings
from posenc.errors import PosencError, sigterm_as_interrupt
from posenc.eval import progress
from posenc.store.stamp import git_commit

# subcommand modules, in the order `posenc --help` lists them
COMMANDS = [
    "posenc.cli.list_cmd",
    "posenc.cli.train_cmd",
    "posenc.cli.eval_cmd",
    "posenc.cli.generate_cmd",
    "posenc.cli.compare_cmd",
    "posenc.cli.report_cmd",
    "posenc.cli.extend_cmd",
    "posenc.cli.finetune_cmd",
    "posenc.cli.harness_cmd",
    "posenc.cli.diagnose_cmd",
]


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors: one line, exit 2
        self.exit(2, f"posenc: error: {message}\n")


def build_parser(commands: Sequence[Callable] = ()) -> argparse.ArgumentParser:
    """The ``posenc`` parser: the subcommands of COMMANDS, then each of ``commands`` (an ``add_parser(subparsers)``)."""
    parser = _Parser(prog="posenc", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--version",
        action="version",
        version=f"posenc {posenc.__version__} (commit {git_commit() or 'n/a'}), torch {torch.__version__}",
    )
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE (a module name or a .py path) before the command, for the schemes or claim sets it "
        "registers (a study's claim set: experiments/NAME/claims.py); give it before the "
        "command; job processes import it too (as POSENC_IMPORT, comma-separated, does)",
    )
    add_verbosity(parser, False)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in COMMANDS:
        importlib.import_module(name).add_parser(sub)
    for add_parser in commands:
        add_parser(sub)
    for command in sub.choices.values():  # after the command too: `posenc train --quiet ...`
        add_verbosity(command, argparse.SUPPRESS)
    return parser


def add_verbosity(p: argparse.ArgumentParser, default) -> None:
    """``--quiet`` / ``--verbose``; a subcommand's default is SUPPRESS, so that the flag given before it stands."""
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=default,
        help="no progress bars or progress lines on stderr: only results, warnings and errors",
    )
    g.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=default,
        help="also the per-step training log, and progress bars when stderr is not a terminal (as whole lines, "
        "every 10 s); default: bars on a terminal only",
    )


def verbosity(args) -> str | None:
    """The verbosity the command line gives (None: $POSENC_PROGRESS's, else normal). PosencError when both
    --quiet and --verbose are given (one before the subcommand, one after it)."""
    if args.quiet and args.verbose:
        raise PosencError("--quiet and --verbose exclude each other")
    return "quiet" if args.quiet else "verbose" if args.verbose else None


def interrupted_message(exc: KeyboardInterrupt, argv: list[str]) -> str:
    """What Ctrl-C prints. A command that checkpointed raises ``KeyboardInterrupt(where, *flags)``: where its
    work is kept, and the flags a rerun needs beyond ``argv`` (e.g. ``--resume``); the message then names
    the command that resumes it."""
    if not exc.args or not exc.args[0]:
        return "posenc: interrupted"
    where, extra = str(exc.args[0]), [str(a) for a in exc.args[1:] if str(a) not in argv]
    return f"posenc: interrupted: {where}\nposenc: resume with: {shlex.join(['posenc', *argv, *extra])}"


def main(argv: list[str] | None = None, commands: Sequence[Callable] = ()) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); its exit code. ``commands``: subcommands beside
    the library's, each an ``add_parser(subparsers)`` as a module of COMMANDS has (a study's own command, run by the
    study's script: docs/plugins.md)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    with sigterm_as_interrupt() as received:
        return _run(argv, received, commands)


def _run(argv: list[str], received: list[int], commands: Sequence[Callable] = ()) -> int:
    try:  # build_parser imports the command modules (torch: seconds), so Ctrl-C there is an interrupt too
        args = build_parser(commands).parse_args(argv)
        with progress.verbosity(verbosity(args)):
            progress.level()  # a bad $POSENC_PROGRESS: one line before any work
            for target in args.imports:
                encodings.import_schemes(target)
            return int(args.func(args) or 0)
    except PosencError as exc:
        print(f"posenc: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print(interrupted_message(exc, argv), file=sys.stderr)
        return 128 + (received[0] if received else signal.SIGINT)
    except BrokenPipeError:  # the reader closed stdout: point it at devnull so the exit flush cannot fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
