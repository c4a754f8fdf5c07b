"""The README's claims table, generated from the committed three-seed text run (``results/default``): each claim's
verdict (marked "(not robust: ...)" where an alternative rule flips it) with its effect and 95% interval
(``experiments.accumulated.claims.readme_claims``).
``.venv/bin/python -m experiments.accumulated.readme_claims README.md`` rewrites the block between BEGIN and END;
``tests/experiments/test_readme_claims.py`` checks they agree."""

from __future__ import annotations

import sys
from pathlib import Path

from experiments.accumulated.claims import readme_claims
from posenc.reports.tasks import read_text_results
from posenc.reports.text import with_ratios
from posenc.store.checkpoint import atomic_write_bytes

BEGIN, END = "<!-- claims:begin -->", "<!-- claims:end -->"
DEFAULT = Path(__file__).resolve().parents[2] / "results" / "default"


def block(run_dir: Path = DEFAULT) -> str:
    """The claims table of the text run ``run_dir`` as the README shows it."""
    records = with_ratios(read_text_results(run_dir))
    return readme_claims(records, min(r.train_length for r in records))


def current(path: Path) -> str:
    """What lies between BEGIN and END in ``path`` (after BEGIN's line end); "" without the block."""
    text = Path(path).read_text(encoding="utf-8")
    return text.partition(BEGIN)[2].partition(END)[0].removeprefix("\n") if BEGIN in text else ""


def write(path: Path) -> None:
    """Replace the block of ``path`` by :func:`block` (ValueError when it lacks BEGIN or END)."""
    text = Path(path).read_text(encoding="utf-8")
    if BEGIN not in text or END not in text.partition(BEGIN)[2]:
        raise ValueError(f"{path} has no {BEGIN} ... {END} block")
    before, _, rest = text.partition(BEGIN)
    atomic_write_bytes(Path(path), f"{before}{BEGIN}\n{block()}{END}{rest.partition(END)[2]}".encode())


if __name__ == "__main__":
    write(Path(sys.argv[1]))
