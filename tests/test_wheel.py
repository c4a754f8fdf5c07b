"""The built wheel: its metadata names every extra of pyproject.toml with its requirements, it holds every module,
preset and ``py.typed``, and installed on its own (a fresh virtualenv) it runs `posenc compare --preset quick` with
TensorBoard tracking and the stamp, `--version`, `list --json` with the parameters' meanings, and `report`."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "src")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built offline (this environment's setuptools) from a copy of the sources: a build in the
    checkout would leave build/ there, whose stale files a later build would pack."""
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy
        copy(REPO / name, src / name, **({"ignore": shutil.ignore_patterns("__pycache__", "*.egg-info")} if copy is shutil.copytree else {}))
    dist = src / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist), str(src)], check=True)
    return next(dist.glob("posenc-*.whl"))


def test_wheel_metadata_names_every_extra_and_its_requirements(wheel):
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {"test", "pretrained", "hub", "cuda", "tensorboard", "wandb", "slurm"} <= set(declared)
    with zipfile.ZipFile(wheel) as z:
        meta = Parser().parsestr(z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode())
    assert sorted(meta.get_all("Provides-Extra")) == sorted(declared)
    listed = [Requirement(r) for r in meta.get_all("Requires-Dist")]
    for extra, reqs in declared.items():
        got = sorted(f"{r.name}{r.specifier}" for r in listed if r.marker and r.marker.evaluate({"extra": extra}))
        assert got == sorted(f"{r.name}{r.specifier}" for r in map(Requirement, reqs)), extra
    core = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert sorted(str(r) for r in listed if not r.marker) == sorted(str(Requirement(r)) for r in core)
    assert meta["Name"] == "posenc"


def test_wheel_holds_every_module_preset_and_py_typed(wheel):
    with zipfile.ZipFile(wheel) as z:
        packed = {n for n in z.namelist() if n.startswith("posenc/")}
        entry_points = next(z.read(n).decode() for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))
    shipped = {p.relative_to(REPO / "src").as_posix() for p in (REPO / "src" / "posenc").rglob("*")
               if p.is_file() and p.suffix in (".py", ".yaml", ".typed") and "__pycache__" not in p.parts}
    assert {"posenc/py.typed", "posenc/configs/quick.yaml", "posenc/configs/extend/quick.yaml", "posenc/configs/finetune/quick.yaml",
            "posenc/configs/theory/quick.yaml", "posenc/encodings/registry.py"} <= shipped
    assert packed == shipped
    assert "posenc = posenc.cli:main" in entry_points


@pytest.mark.slow
def test_installed_wheel_runs_compare_with_tracking_version_list_and_report(tmp_path, tiny_corpus, wheel):
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
    posenc = lambda *argv: subprocess.run([venv / "bin" / "posenc", *argv], capture_output=True, text=True, cwd=tmp_path, env=env)  # noqa: E731
    out = posenc("compare", "--preset", "quick", "--schemes", "rope", "alibi", "--steps", "3", "--corpus", str(tiny_corpus),
                 "--out", str(tmp_path / "runs"), "--log", "tensorboard")
    assert out.returncode == 0, out.stderr[-2000:]
    report = (tmp_path / "runs" / "quick" / "report.md").read_text()
    assert "| rope | 1.000 |" in report and "| alibi | 1.000 |" in report
    assert any((tmp_path / "runs" / "quick" / "rope" / "seed0").glob("events.out.tfevents.*"))  # tracking from the wheel
    stamp = json.loads((tmp_path / "runs" / "quick" / "invocations.jsonl").read_text().splitlines()[0])
    assert stamp["posenc"] == "0.1.0" and stamp["commit"] is None  # not a checkout
    assert posenc("--version").stdout.startswith("posenc 0.1.0 (commit n/a), torch ")
    listing = json.loads(posenc("list", "--json").stdout)  # parameter meanings come from the installed docstrings
    rope = next(s for s in listing["schemes"] if s["name"] == "rope")
    assert [(p["name"], p["default"]) for p in rope["params"]] == [("rope_theta", 10000.0), ("pairing", "half"), ("rotary_fraction", 1.0)]
    assert all(p["doc"] for p in rope["params"])
    out = posenc("report", str(tmp_path / "runs" / "quick"), str(REPO / "results" / "default"), "--out", str(tmp_path / "side"))  # a committed run beside it
    assert out.returncode == 0, out.stderr[-2000:]
    assert (tmp_path / "side" / "report.md").is_file()
