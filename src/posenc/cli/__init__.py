"""The ``posenc`` command (``main``) and one module per subcommand (``*_cmd``: argument parsing and one call),
with what their parsers share (``common``). The top layer."""

import sys


def run() -> int:
    """The console script's and ``python -m posenc``'s entry: :func:`posenc.cli.main.main` once its imports are done.

    Importing torch takes a second or more; a Ctrl-C then ends as one during a command does (``posenc:
    interrupted``, exit code 130), not with an import traceback.
    """
    try:
        from posenc.cli.main import main
    except KeyboardInterrupt:
        sys.stderr.write("posenc: interrupted\n")
        return 130
    return main()
