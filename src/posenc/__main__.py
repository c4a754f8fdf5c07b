"""``python -m posenc``: the ``posenc`` command (``posenc.cli.main.main``), for an environment whose scripts
directory is not on PATH."""

import sys

from posenc.cli.main import main

sys.exit(main())
