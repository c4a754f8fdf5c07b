"""The layer rule, on the source and at run time: the core (attention, encodings, layer, rope, scoring) imports
torch and numpy only, so ``import posenc.attention`` or ``posenc.encodings`` loads no pydantic, matplotlib,
transformers or ``posenc.theory``; ``posenc.theory`` sits on the core and the shared helpers, never on the apps.

Layers, bottom up (README, "Layout"):
- core: errors, attention, scoring, layer, encodings/*, rope/*, and the package ``posenc`` itself (lazy: PEP 562).
  model.py is not core: its ModelConfig is pydantic.
- theory: theory/*, on the core and on checkpoint, presets, reporting.
- apps: every other module, on anything below (no cycles: tests/test_imports.py).
"""

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
CORE = ("posenc.errors", "posenc.attention", "posenc.scoring", "posenc.layer", "posenc.encodings", "posenc.rope")
THEORY_HELPERS = ("posenc.checkpoint", "posenc.presets", "posenc.reporting")
CORE_EXTERNAL = {"torch", "numpy"}
CORE_LAZY_EXTERNAL = {"fla"}  # flash-linear-attention's PaTH kernel: imported inside the CUDA path only (householder.py)
HEAVY = ("matplotlib", "transformers", "pydantic", "yaml", "safetensors", "datasets", "tokenizers")  # tqdm: torch imports it itself


def _modules() -> dict[str, Path]:
    out = {}
    for path in (SRC / "posenc").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _in(name: str, packages: tuple[str, ...]) -> bool:
    """Whether module ``name`` is one of ``packages`` or inside one; the package ``posenc`` is core (it imports nothing)."""
    return name == "posenc" or any(name == p or name.startswith(p + ".") for p in packages)


def _imports(name: str, path: Path) -> list[tuple[str, bool]]:
    """(imported module, inside a function) for every import of the file; relative imports resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    nested = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(f)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, id(node) in nested) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            out += [(base, id(node) in nested)] + [(f"{base}.{a.name}", id(node) in nested) for a in node.names]
    return out


def _violations(mods: dict[str, Path]) -> list[str]:
    bad = []
    for name, path in sorted(mods.items()):
        core, theory = _in(name, CORE), name.startswith("posenc.theory")
        if not (core or theory):
            continue
        allowed = CORE if core else (*CORE, *THEORY_HELPERS, "posenc.theory")
        for target, lazy in _imports(name, path):
            top = target.split(".")[0]
            if top == "posenc":
                # "from posenc.x import name" also yields "posenc.x.name": judge the module part only
                module = max((m for m in mods if target == m or target.startswith(m + ".")), key=len)
                if not _in(module, allowed):
                    bad.append(f"{name} imports {module}")
            elif core and top not in sys.stdlib_module_names and top not in CORE_EXTERNAL and not (lazy and top in CORE_LAZY_EXTERNAL):
                bad.append(f"{name} imports {target}")
    return sorted(set(bad))


def test_core_and_theory_import_only_their_layers():
    mods = _modules()
    assert {"posenc.attention", "posenc.encodings.mixing", "posenc.rope.schedules", "posenc.theory.mixing"} <= set(mods)
    assert _violations(mods) == []


def test_the_layer_check_finds_an_upward_import(tmp_path):
    pkg = tmp_path / "posenc"
    (pkg / "encodings").mkdir(parents=True)
    (pkg / "theory").mkdir()
    for f, text in {"__init__.py": "", "model.py": "import pydantic\n", "encodings/__init__.py": "",
                    "encodings/x.py": "from posenc.theory.mixing import w\nimport matplotlib\n\ndef f():\n    import fla\n",
                    "theory/__init__.py": "", "theory/mixing.py": "from posenc.model import LM\n"}.items():
        (pkg / f).write_text(text)
    mods = {m: pkg.parent / p for m, p in {
        "posenc": "posenc/__init__.py", "posenc.model": "posenc/model.py", "posenc.encodings": "posenc/encodings/__init__.py",
        "posenc.encodings.x": "posenc/encodings/x.py", "posenc.theory": "posenc/theory/__init__.py",
        "posenc.theory.mixing": "posenc/theory/mixing.py"}.items()}
    assert _violations(mods) == ["posenc.encodings.x imports matplotlib", "posenc.encodings.x imports posenc.theory.mixing",
                                 "posenc.theory.mixing imports posenc.model"]


def test_importing_the_core_loads_no_heavy_module():
    code = (
        "import sys\n"
        "import posenc\n"
        "assert 'torch' not in sys.modules, 'import posenc loads torch'\n"
        "import posenc.attention, posenc.encodings, posenc.layer, posenc.rope, posenc.scoring\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert [m for m in loaded if m.split(".")[0] in HEAVY] == []
    assert [m for m in loaded if m.startswith("posenc") and not _in(m, CORE)] == []
    assert "posenc.encodings.accumulated" in loaded and "posenc.rope.schedules" in loaded


def test_the_public_names_load_on_first_access():
    code = "import sys, posenc\nposenc.PosencError\nassert 'posenc.model' not in sys.modules\nposenc.LM, posenc.hf\nprint('posenc.hf' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split() == ["True"]
