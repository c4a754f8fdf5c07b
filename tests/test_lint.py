"""The code style the suite keeps: ruff's lint (pyproject.toml's rule set) and its formatter, over src, tests,
benchmarks and docs' examples. A failure names the file and line: run ``ruff check --fix .`` and ``ruff format .``.
The library's core type-checks under mypy (pyproject.toml's ``[tool.mypy]``: run ``python -m mypy``)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_lint_passes():
    proc = _ruff("check", "--no-cache", ".")
    assert proc.returncode == 0 and "All checks passed!" in proc.stdout, proc.stdout + proc.stderr


def test_ruff_format_leaves_every_file_as_it_is():
    proc = _ruff("format", "--check", "--no-cache", ".")
    assert proc.returncode == 0 and "already formatted" in proc.stdout, proc.stdout + proc.stderr


def test_mypy_passes_on_the_core():
    proc = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
