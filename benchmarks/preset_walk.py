"""The walk of a preset: where ``posenc.jobs.compare.compare``'s ``preset`` goes, read statically from the source.

    python benchmarks/preset_walk.py            (prints the stays per module, the climbs and the totals)
    python benchmarks/preset_walk.py --parts    (the preset's sections followed too: preset.eval, preset.model, ...)

Starting at ``compare(preset)``, every posenc function the preset itself is handed to (as an argument, under
whatever name the callee gives it, or under an alias ``p = preset``) is a *stay*, and is walked in turn. A job
tuple ``(fn, (..., preset, ...))`` given to a function (``run_pool(jobs)``, ``run_inline(fn, args)``) makes that
function a stay and counts as a call of ``fn`` from its module: that is where ``fn(*args)`` runs. Attributes of
the preset (``preset.model``) are other objects and are not followed (``--parts`` follows them, and their
copies: ``model_copy``, ``dataclasses.replace``); neither are methods called on it (pydantic's).

A *climb* is a call from one module to a function of a module higher in the "Layout" list of docs/layout.md (bottom up,
so imports point down it: ``tests/test_layers.py``); each (calling module, called function) counts once.
Nothing is imported or run: the files are parsed with ``ast``.
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def layout_order(readme: Path) -> list[str]:
    """The entries of the "## Layout" listing (docs/layout.md), bottom up: ``errors.py``, ``rope/``, ... (one per name
    of the first column, so ``report.py, claims.py`` gives two)."""
    block = readme.read_text().split("## Layout", 1)[1].split("```", 2)[1]
    names = []
    for line in block.splitlines():
        m = re.match(r"^  (\S.*?)(?:\s{2,}|$)", line)
        if m:
            names += m.group(1).split(", ")
    return names


def unit(module: str, src: Path) -> str:
    """The layout entry a module belongs to: ``posenc.rope.schedules`` -> ``rope/``, ``posenc.jobs.compare`` ->
    ``compare.py``."""
    top = module.removeprefix("posenc.").split(".")[0]
    return f"{top}/" if (src / "posenc" / top).is_dir() else f"{top}.py"


def modules(src: Path) -> dict[str, Path]:
    """Every module of the package under ``src``: dotted name -> file."""
    out = {}
    for path in (src / "posenc").rglob("*.py"):
        parts = list(path.relative_to(src).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


class _Module:
    """One parsed module: its top-level functions and the names its imports bind (lazy ones too)."""

    def __init__(self, name: str, path: Path, names: set[str]):
        self.name, tree = name, ast.parse(path.read_text())
        self.functions = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        self.bound: dict[str, tuple[str, str | None]] = {}  # local name -> (module, attribute or None for the module)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    self.bound[a.asname or a.name.split(".")[0]] = (a.name if a.asname else a.name.split(".")[0], None)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(
                        package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                    )
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    self.bound[a.asname or a.name] = (sub, None) if sub in names else (base, a.name)


@dataclass
class Walk:
    stays: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))  # module -> functions reached
    climbs: list[tuple[str, str]] = field(default_factory=list)  # (calling module, "module.function" called)

    @property
    def n_stays(self) -> int:
        return sum(len(f) for f in self.stays.values())


class _Walker:
    def __init__(self, src: Path, readme: Path, parts: bool = False):
        self.src, self.parts, paths = src, parts, modules(src)
        self.mods = {n: _Module(n, p, set(paths)) for n, p in paths.items()}
        order = layout_order(readme)
        self.rank = {n: order.index(unit(n, src)) for n in paths if n != "posenc" and unit(n, src) in order}
        self.walk, self.seen = Walk(), set()

    def resolve(self, module: str, node: ast.expr, depth: int = 0) -> tuple[str, str] | None:
        """(module, function) a name or ``alias.attr`` refers to, following re-exports; None if not a posenc
        function."""
        if isinstance(node, ast.Name):
            return self._lookup(module, node.id, depth)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            target = self.mods[module].bound.get(node.value.id)
            if target and target[1] is None and target[0] in self.mods:
                return self._lookup(target[0], node.attr, depth)
        return None

    def _lookup(self, module: str, name: str, depth: int) -> tuple[str, str] | None:
        mod = self.mods.get(module)
        if mod is None or depth > 5:
            return None
        if name in mod.functions:
            return module, name
        target = mod.bound.get(name)
        if target and target[1] is not None:
            return self._lookup(target[0], target[1], depth + 1)
        return None

    def visit(self, module: str, fn: str, param: str | None, caller: str | None) -> None:
        """``module.fn`` reached from module ``caller`` with the preset in its parameter ``param`` (None: in a job
        list)."""
        if caller is not None and caller != module and self.rank.get(module, -1) > self.rank.get(caller, -1):
            if (caller, f"{module}.{fn}") not in self.walk.climbs:
                self.walk.climbs.append((caller, f"{module}.{fn}"))
        if fn not in self.walk.stays[module]:
            self.walk.stays[module].append(fn)
        if param is not None and (module, fn, param) not in self.seen:  # each parameter that receives it, once
            self.seen.add((module, fn, param))
            self._body(module, self.mods[module].functions[fn], param)

    def _body(self, module: str, node: ast.FunctionDef, param: str) -> None:
        tracked = {param}
        for n in ast.walk(node):  # aliases: p = preset (with parts: m, t = preset.model, preset.train too)
            if isinstance(n, ast.Assign):
                for t in n.targets:
                    pairs = (
                        zip(t.elts, n.value.elts)
                        if isinstance(t, ast.Tuple) and isinstance(n.value, ast.Tuple)
                        else [(t, n.value)]
                    )
                    tracked |= {a.id for a, v in pairs if isinstance(a, ast.Name) and self._holds(v, tracked)}
        holders = {}  # names bound to an expression holding a job tuple: jobs = [(run_job, (..., preset, ...)), ...]
        for n in ast.walk(node):
            if isinstance(n, ast.Assign) and self._jobs_in(module, n.value, tracked):
                holders.update({t.id: n.value for t in n.targets if isinstance(t, ast.Name)})
        for call in [n for n in ast.walk(node) if isinstance(n, ast.Call)]:
            callee = self.resolve(module, call.func)
            if callee is None:
                continue
            for name in self._params(callee, call, tracked):
                self.visit(*callee, name, module)
            jobs = self._jobs_in(module, ast.Tuple(elts=list(call.args)), tracked) + [
                job
                for a in call.args
                if isinstance(a, ast.Name) and a.id in holders
                for job in self._jobs_in(module, holders[a.id], tracked)
            ]
            if jobs:
                self.visit(*callee, None, module)
                for target, name in jobs:
                    self.visit(*target, name, callee[0])

    def _params(self, callee: tuple[str, str], call: ast.Call, tracked: set[str]) -> list[str]:
        """The callee's parameters that receive the preset in ``call``."""
        args = self.mods[callee[0]].functions[callee[1]].args
        positional = [a.arg for a in args.posonlyargs + args.args]
        out = []
        for i, a in enumerate(call.args):
            if isinstance(a, ast.Starred):
                break
            if self._holds(a, tracked):
                out.append(positional[i] if i < len(positional) else args.vararg.arg)
        out += [k.arg for k in call.keywords if k.arg and self._holds(k.value, tracked)]
        return out

    def _holds(self, expr: ast.expr, tracked: set[str]) -> bool:
        """Whether ``expr`` is the preset (a tracked name); with ``parts`` also ``preset.eval.passkey`` or a copy
        of such a part (``part.model_copy(...)``, ``dataclasses.replace(part, ...)``: ``preset.model``)."""
        while self.parts:
            if isinstance(expr, ast.Attribute):
                expr = expr.value
            elif isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "model_copy":
                expr = expr.func.value
            elif isinstance(expr, ast.Call) and ast.unparse(expr.func) == "dataclasses.replace" and expr.args:
                expr = expr.args[0]
            else:
                break
        return isinstance(expr, ast.Name) and expr.id in tracked

    def _jobs_in(self, module: str, expr: ast.expr, tracked: set[str]) -> list[tuple[tuple[str, str], str]]:
        """((module, function), parameter) of each job tuple ``(fn, (..., preset, ...))`` inside ``expr``."""
        out = []
        for t in [n for n in ast.walk(expr) if isinstance(n, ast.Tuple)]:
            for f, args in zip(t.elts, t.elts[1:]):
                target = self.resolve(module, f)
                if target is None or not isinstance(args, ast.Tuple):
                    continue
                params = self._params(target, ast.Call(func=f, args=args.elts, keywords=[]), tracked)
                out += [(target, p) for p in params]
        return out


def walk(
    src: Path = ROOT / "src",
    readme: Path = ROOT / "docs" / "layout.md",
    start: tuple[str, str, str] = ("posenc.jobs.compare", "compare", "preset"),
    parts: bool = False,
) -> Walk:
    """The stays and climbs of ``start`` = (module, function, parameter) in the package under ``src``; ``parts``:
    follow the preset's sections too (``preset.eval``, ``dataclasses.replace(preset.model, ...)``), not only the
    preset."""
    walker = _Walker(src, readme, parts)
    walker.visit(*start, None)
    return walker.walk


def calls(module: str, fn: str, src: Path = ROOT / "src", readme: Path = ROOT / "docs" / "layout.md") -> set[str]:
    """ "module.function" of every posenc function ``module.fn`` calls by name (nested functions included)."""
    walker = _Walker(src, readme)
    found = (
        walker.resolve(module, n.func) for n in ast.walk(walker.mods[module].functions[fn]) if isinstance(n, ast.Call)
    )
    return {f"{m}.{f}" for m, f in filter(None, found)}


def main() -> None:
    w = walk(parts="--parts" in sys.argv[1:])
    for module, fns in w.stays.items():
        print(f"{module.removeprefix('posenc.')}: {', '.join(fns)}")
    for caller, callee in w.climbs:
        print(f"climb: {caller.removeprefix('posenc.')} -> {callee.removeprefix('posenc.')}")
    print(f"{w.n_stays} stays in {len(w.stays)} modules, {len(w.climbs)} climbs")


if __name__ == "__main__":
    sys.exit(main())
