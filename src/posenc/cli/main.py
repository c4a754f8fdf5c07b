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
import errno
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
from posenc.store.lock import holding
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
    program = "posenc"  # the name errors are printed under (``build_parser`` sets a study's script's)

    def error(self, message):  # argparse's own errors: one line, exit 2
        self.exit(2, f"{self.program}: error: {message}\n")


def build_parser(commands: Sequence[Callable] = (), prog: str = "posenc") -> argparse.ArgumentParser:
    """The ``posenc`` parser: the subcommands of COMMANDS, then each of ``commands`` (an ``add_parser(subparsers)``);
    ``prog``: the program its errors name (``main``'s)."""
    parser = _Parser(prog=prog, description=__doc__.splitlines()[0])
    parser.program = prog
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
        command.program = prog
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


def interrupted_message(exc: KeyboardInterrupt, argv: list[str], prog: str = "posenc") -> str:
    """What Ctrl-C prints, under the program name ``prog``. A command that checkpointed raises
    ``KeyboardInterrupt(where, *flags)``: where its work is kept, and the flags a rerun needs beyond ``argv`` (e.g.
    ``--resume``); the message then names the command that resumes it (``posenc``'s commands checkpoint)."""
    if not exc.args or not exc.args[0]:
        return f"{prog}: interrupted"
    where, extra = str(exc.args[0]), [str(a) for a in exc.args[1:] if str(a) not in argv]
    return f"{prog}: interrupted: {where}\n{prog}: resume with: {shlex.join(['posenc', *argv, *extra])}"


# the file system's refusals (read-only, full, over quota; a path it cannot take: a name over its limit, a symlink
# loop): the machine's or the input's, not posenc's bug, like EACCES
MACHINE_REFUSALS = {errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.ENAMETOOLONG, errno.ELOOP}


def main(argv: list[str] | None = None, commands: Sequence[Callable] = (), prog: str = "posenc") -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); its exit code. ``commands``: subcommands beside
    the library's, each an ``add_parser(subparsers)`` as a module of COMMANDS has (a study's own command, run by the
    study's script: docs/plugins.md); ``prog``: the program that errors and interrupts are printed under
    (``PROG: error: ...``; a study's script gives its own name)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    with sigterm_as_interrupt() as received:
        return _run(argv, received, commands, prog)


def _run(argv: list[str], received: list[int], commands: Sequence[Callable] = (), prog: str = "posenc") -> int:
    try:  # build_parser imports the command modules (torch: seconds), so Ctrl-C there is an interrupt too
        args = build_parser(commands, prog).parse_args(argv)
        with progress.verbosity(verbosity(args)):
            progress.level()  # a bad $POSENC_PROGRESS: one line before any work
            for target in args.imports:
                encodings.import_schemes(target)
            with holding():  # the run directories the command writes into: this process's until it ends
                return int(args.func(args) or 0)
    except PosencError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except PermissionError as exc:  # the machine's refusal, never posenc's bug: one line naming the path
        print(f"{prog}: error: permission denied: {exc.filename or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print(interrupted_message(exc, argv, prog), file=sys.stderr)
        return 128 + (received[0] if received else signal.SIGINT)
    except BrokenPipeError:  # the reader closed stdout: point it at devnull so the exit flush cannot fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as exc:
        if exc.errno not in MACHINE_REFUSALS:  # any other OSError may be a bug: its traceback
            raise
        print(f"{prog}: error: {os.strerror(exc.errno).lower()}: {exc.filename or exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
