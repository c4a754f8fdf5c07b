"""User-facing errors: the CLI prints them as one line and exits with code 2."""


class PosencError(Exception):
    """Bad input (unknown scheme, invalid config, missing corpus, ...).

    Raised anywhere in posenc for problems the user can fix; ``posenc.cli.main``
    turns it into ``posenc: error: <message>`` on stderr and exit code 2.
    """


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, or its type name when it has none (for one-line errors)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
