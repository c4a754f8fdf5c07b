"""``python -m posenc``: the ``posenc`` command (``posenc.cli.run``), for an environment whose scripts
directory is not on PATH."""

import sys

from posenc.cli import run

sys.exit(run())
