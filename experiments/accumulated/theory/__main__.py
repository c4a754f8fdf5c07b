"""``python -m experiments.accumulated.theory [options]``, from the repository root: the study's Monte Carlo checks
as a posenc command (``cli.py``; exit 0 if every check holds, 1 otherwise, 2 for bad input)."""

import sys

from experiments.accumulated.theory.cli import theory

sys.exit(theory(sys.argv[1:]))
