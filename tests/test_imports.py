"""posenc's modules form a DAG: no import cycle, counting imports at any depth (lazy ones too)."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _modules() -> dict[str, Path]:
    out = {}
    for path in (SRC / "posenc").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: Path, mods: dict) -> set[str]:
    """posenc modules ``name`` imports anywhere in its file, with the packages whose __init__ that runs."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            found |= {base} | {f"{base}.{a.name}" for a in node.names}
    own = {".".join(name.split(".")[:k]) for k in range(1, name.count(".") + 1)}  # running already (registry pattern)
    with_parents = {".".join(t.split(".")[:k]) for t in found for k in range(1, t.count(".") + 2)}
    return {t for t in with_parents if t in mods} - own - {name}


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle as a list of modules, or [] (depth-first search with colours)."""
    state, path = {}, []

    def visit(m):
        state[m] = "open"
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                return path[path.index(n) :] + [n]
            if n not in state and (found := visit(n)):
                return found
        state[m] = "done"
        path.pop()
        return []

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return []


def test_no_import_cycle():
    mods = _modules()
    graph = {m: _imports(m, p, mods) for m, p in mods.items()}
    assert len(graph) > 50 and "posenc.attention" in graph["posenc.layer"]
    assert _cycle(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
