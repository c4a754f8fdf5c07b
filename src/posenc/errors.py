"""User-facing errors: the CLI prints them as one line and exits with code 2."""


class PosencError(Exception):
    """Bad input (unknown scheme, invalid config, missing corpus, ...).

    Raised anywhere in posenc for problems the user can fix; ``posenc.cli.main``
    turns it into ``posenc: error: <message>`` on stderr and exit code 2.
    """
