"""The built wheel works on its own: presets ship as package data, `posenc compare --preset quick` runs."""

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_installed_wheel_runs_compare_quick(tmp_path, tiny_corpus):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"), str(REPO)], check=True)
    wheel = next((tmp_path / "dist").glob("posenc-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True, check=True).stdout.strip())
    # dependencies (torch, ...) from this environment, appended after the venv's own site-packages;
    # its editable posenc is not activated (a .pth path line does not run the .pth files there)
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", str(wheel)], check=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    where = subprocess.run([py, "-c", "import posenc, importlib.resources as r; print(posenc.__file__); print(r.files('posenc') / 'configs' / 'quick.yaml')"],
                           capture_output=True, text=True, check=True, cwd=tmp_path, env=env).stdout.split()
    assert all(p.startswith(str(site)) for p in where) and Path(where[1]).is_file()
    out = subprocess.run([venv / "bin" / "posenc", "compare", "--preset", "quick", "--schemes", "rope", "alibi", "--steps", "3",
                          "--corpus", str(tiny_corpus), "--out", str(tmp_path / "runs")], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    report = (tmp_path / "runs" / "quick" / "report.md").read_text()
    assert "| rope | 1.000 |" in report and "| alibi | 1.000 |" in report
