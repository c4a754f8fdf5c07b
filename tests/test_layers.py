"""The layer rule, on the source and at run time: the core (attention, encodings, layer, model, rope, scoring)
imports torch and numpy only, so ``import posenc.attention``, ``posenc.encodings`` or ``posenc.model`` loads no
pydantic, matplotlib or transformers.

Layers, bottom up (docs/layout.md, "Layout"):
- core: errors, attention, methods, scoring, layer, model, encodings/*, rope/*, and the package ``posenc`` itself
  (lazy: PEP 562).
- apps: one folder per layer (store/, data/, hf/, eval/, train/, config/, reports/, jobs/, cli/), each on
  the folders below it in the "Layout" list of docs/layout.md (imports point down it; no cycles:
  tests/test_imports.py).

The walk of compare's preset (``benchmarks/preset_walk.py``) stays within 30 functions and 5 climbs back up
that list."""

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
LAYOUT = ROOT / "docs" / "layout.md"  # its "Layout" listing, bottom up
CORE = (
    "posenc.errors",
    "posenc.attention",
    "posenc.methods",
    "posenc.scoring",
    "posenc.layer",
    "posenc.model",
    "posenc.encodings",
    "posenc.rope",
)
CORE_EXTERNAL = {"torch", "numpy"}
CORE_LAZY_EXTERNAL = {
    "fla"
}  # flash-linear-attention's PaTH kernel: imported inside the CUDA path only (householder.py)
APP_FOLDERS = ["store/", "data/", "hf/", "eval/", "train/", "config/", "reports/", "jobs/", "cli/"]
HEAVY = (
    "matplotlib",
    "transformers",
    "pydantic",
    "yaml",
    "safetensors",
    "datasets",
    "tokenizers",
)  # tqdm: torch imports it itself


def _modules() -> dict[str, Path]:
    out = {}
    for path in (SRC / "posenc").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _in(name: str, packages: tuple[str, ...]) -> bool:
    """Whether module ``name`` is one of ``packages`` or inside one; the package ``posenc`` is core (it imports
    nothing)."""
    return name == "posenc" or any(name == p or name.startswith(p + ".") for p in packages)


def _imports(name: str, path: Path) -> list[tuple[str, bool]]:
    """(imported module, inside a function) for every import of the file; relative imports resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    nested = {
        id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(f)
    }
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, id(node) in nested) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            out += [(base, id(node) in nested)] + [(f"{base}.{a.name}", id(node) in nested) for a in node.names]
    return out


def _violations(mods: dict[str, Path]) -> list[str]:
    bad = []
    for name, path in sorted(mods.items()):
        if not _in(name, CORE):
            continue
        for target, lazy in _imports(name, path):
            top = target.split(".")[0]
            if top == "posenc":
                # "from posenc.x import name" also yields "posenc.x.name": judge the module part only
                module = max((m for m in mods if target == m or target.startswith(m + ".")), key=len)
                if not _in(module, CORE):
                    bad.append(f"{name} imports {module}")
            elif (
                top not in sys.stdlib_module_names
                and top not in CORE_EXTERNAL
                and not (lazy and top in CORE_LAZY_EXTERNAL)
            ):
                bad.append(f"{name} imports {target}")
    return sorted(set(bad))


def test_the_core_imports_only_its_layer():
    mods = _modules()
    assert {"posenc.attention", "posenc.encodings.accumulated", "posenc.rope.schedules"} <= set(mods)
    assert _violations(mods) == []


def test_the_layer_check_finds_an_upward_import(tmp_path):
    pkg = tmp_path / "posenc"
    (pkg / "encodings").mkdir(parents=True)
    (pkg / "config").mkdir()
    for f, text in {
        "__init__.py": "",
        "config/__init__.py": "",
        "config/plan.py": "import pydantic\n",
        "encodings/__init__.py": "",
        "encodings/x.py": "from posenc.config.plan import Preset\nimport matplotlib\n\ndef f():\n    import fla\n",
    }.items():
        (pkg / f).write_text(text)
    mods = {
        m: pkg.parent / p
        for m, p in {
            "posenc": "posenc/__init__.py",
            "posenc.config": "posenc/config/__init__.py",
            "posenc.config.plan": "posenc/config/plan.py",
            "posenc.encodings": "posenc/encodings/__init__.py",
            "posenc.encodings.x": "posenc/encodings/x.py",
        }.items()
    }
    assert _violations(mods) == [
        "posenc.encodings.x imports matplotlib",
        "posenc.encodings.x imports posenc.config.plan",
    ]


def test_importing_the_core_loads_no_heavy_module():
    code = (
        "import sys\n"
        "import posenc\n"
        "assert 'torch' not in sys.modules, 'import posenc loads torch'\n"
        "import posenc.attention, posenc.encodings, posenc.layer, posenc.model, posenc.rope, posenc.scoring\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert [m for m in loaded if m.split(".")[0] in HEAVY] == []
    assert [m for m in loaded if m.startswith("posenc") and not _in(m, CORE)] == []
    assert {"posenc.encodings.accumulated", "posenc.rope.schedules", "posenc.model"} <= set(loaded)


def test_the_public_names_load_on_first_access():
    code = (
        "import sys, posenc\nposenc.PosencError\nassert 'posenc.model' not in sys.modules\n"
        "posenc.LM, posenc.hf.scheme\nprint('posenc.hf.scheme' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split() == [
        "True"
    ]


def _preset_walk():
    spec = importlib.util.spec_from_file_location("preset_walk", ROOT / "benchmarks" / "preset_walk.py")
    module = sys.modules.setdefault("preset_walk", importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)
    return module


def test_the_layout_lists_every_module_bottom_up():
    pw, mods = _preset_walk(), _modules()
    order = pw.layout_order(LAYOUT)
    assert order[:3] == ["errors.py", "attention.py", "rope/"] and order[-2:] == ["cli/", "__main__.py"]
    folders = [u for u in order if u.endswith("/")]
    assert folders == ["rope/", "encodings/", *APP_FOLDERS], folders  # each app folder one layer, in this order
    assert sorted({pw.unit(m, SRC) for m in mods if m != "posenc"} - set(order)) == []
    rank = {m: order.index(pw.unit(m, SRC)) for m in mods if m != "posenc"}
    up = set()
    for name, path in mods.items():
        for target, _ in _imports(name, path):
            if target.split(".")[0] == "posenc" and name != "posenc":
                module = max((m for m in mods if target == m or target.startswith(m + ".")), key=len)
                if module != "posenc" and rank[module] > rank[name]:
                    up.add((name, module))
    assert up == set(), sorted(up)


def test_the_preset_walk_stays_within_its_bounds():
    w = _preset_walk().walk(SRC, LAYOUT)
    assert "compare" in w.stays["posenc.jobs.compare"]  # the walk follows the preset at all (into functions; the
    # plan and its jobs, posenc.jobs.job's classes, are checked on the source below)
    assert w.n_stays <= 30 and len(w.climbs) <= 5, (w.n_stays, w.climbs)
    assert w.climbs == []  # the job runner and the jobs it runs share jobs/


def test_the_preset_walk_counts_stays_and_climbs(tmp_path):
    (tmp_path / "README.md").write_text("## Layout\n\n```\nsrc/posenc/\n  low.py  x\n  mid.py, high.py  y\n```\n")
    pkg = tmp_path / "src" / "posenc"
    pkg.mkdir(parents=True)
    for f, text in {
        "__init__.py": "",
        "low.py": "def run(jobs):\n    pass\n\ndef size(n):\n    pass\n\n"
        "def use(cfg):\n    from posenc.high import back\n    back(cfg)\n",
        "mid.py": "from posenc import low\n\ndef job(a, p):\n    pass\n\n"
        "def go(x):\n    q = x\n    low.use(q)\n    low.run([(job, (1, q))])\n    low.size(x.part)\n",
        "high.py": "from posenc.mid import go as start\n\ndef back(c):\n    pass\n\n"
        "def top(preset):\n    start(x=preset)\n    top(preset)\n",
    }.items():
        (pkg / f).write_text(text)
    w = _preset_walk().walk(tmp_path / "src", tmp_path / "README.md", ("posenc.high", "top", "preset"))
    assert dict(w.stays) == {"posenc.high": ["top", "back"], "posenc.mid": ["go", "job"], "posenc.low": ["use", "run"]}
    assert w.climbs == [("posenc.low", "posenc.high.back"), ("posenc.low", "posenc.mid.job")]
    parts = _preset_walk().walk(tmp_path / "src", tmp_path / "README.md", ("posenc.high", "top", "preset"), parts=True)
    assert parts.stays["posenc.low"] == ["use", "run", "size"] and parts.climbs == w.climbs  # x.part too


def test_compare_reaches_the_report_through_the_traced_files():
    """The trace of docs/layout.md, checked on the source: cli/main -> cli/compare_cmd -> config/plan -> jobs/compare
    -> jobs/launcher -> train/loop, store/records -> reports/text."""
    pw = _preset_walk()
    cli = (SRC / "posenc" / "cli" / "main.py").read_text()
    assert '"posenc.cli.compare_cmd"' in cli and "args.func(args)" in cli
    assert "set_defaults(func=run)" in (SRC / "posenc" / "cli" / "compare_cmd.py").read_text()
    assert {"posenc.config.plan.load_preset", "posenc.jobs.compare.compare"} <= pw.calls(
        "posenc.cli.compare_cmd", "run"
    )
    compare = (SRC / "posenc" / "jobs" / "compare.py").read_text()
    assert all(f"{name}(" in compare for name in ("Plan", "Launcher", "RunStore", "plan.stages", "plan.kind.report"))
    methods = {
        (c.name, f.name): ast.unparse(f)
        for name in ("job", "launcher")
        for c in ast.parse((SRC / "posenc" / "jobs" / f"{name}.py").read_text()).body
        if isinstance(c, ast.ClassDef)
        for f in c.body
        if isinstance(f, ast.FunctionDef)
    }
    assert all(f"{name}(" in methods["TextJob", "run"] for name in ("trained_job", "evaluate_length", "store.append"))
    assert "write_report(" in methods["TextJob", "report"] and "run_pool(" in methods["Launcher", "run"]
    records = (SRC / "posenc" / "store" / "records.py").read_text()
    assert "append(self.path, record)" in records  # the store's append: one line per record
    assert "posenc.train.loop.train" in pw.calls("posenc.jobs.launcher", "trained_job")
    assert {"posenc.store.records.load"} <= pw.calls(
        "posenc.reports.text", "write_report"
    )  # the report reads the store
    report = (SRC / "posenc" / "reports" / "text.py").read_text()
    write = next(n for n in ast.parse(report).body if isinstance(n, ast.FunctionDef) and n.name == "write_report")
    assert '"report.md"' in ast.get_source_segment(report, write)


def test_the_tests_are_laid_out_like_the_source():
    """tests/ mirrors src/posenc/: the core's tests (and the project's: docs, lint, layers, wheel) at its top, every
    other folder named after the source folder it tests, besides experiments/ (the studies) and fixtures/ (data)."""
    folders = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and p.name != "__pycache__"}
    source = {p.name for p in (SRC / "posenc").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders - {"experiments", "fixtures"} <= source, folders - source - {"experiments", "fixtures"}
    assert {f.rstrip("/") for f in APP_FOLDERS} | {"encodings", "rope"} <= folders
