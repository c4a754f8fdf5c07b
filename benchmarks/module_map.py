"""Module map of src/posenc at one or two commits: lines per module and per layer (core, theory, apps), and the
imports between layers, read from git (nothing is imported or run).

    python3 benchmarks/module_map.py COMMIT                 (the summary of one commit)
    python3 benchmarks/module_map.py BEFORE AFTER --out F   (both summaries and a per-module table, as markdown in F;
                                                             e.g. 964e4ff^ HEAD: before and after issue 25)

The layers are today's rule (``tests/test_layers.py``), applied to the older commit as well, so a "core imports
apps" edge before is a module that broke the rule then.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORE = (
    "posenc.errors",
    "posenc.attention",
    "posenc.scoring",
    "posenc.layer",
    "posenc.model",
    "posenc.encodings",
    "posenc.rope",
)
LAYERS = ("core", "theory", "apps")


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True).stdout


def sources(commit: str) -> dict[str, str]:
    """Dotted module name -> source text of every module of src/posenc at ``commit``."""
    files = [f for f in git("ls-tree", "-r", "--name-only", commit, "src/posenc").split() if f.endswith(".py")]
    out = {}
    for f in files:
        parts = f.removeprefix("src/").removesuffix(".py").split("/")
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = git("show", f"{commit}:{f}")
    return out


def layer(name: str) -> str:
    if name == "posenc" or any(name == p or name.startswith(p + ".") for p in CORE):
        return "core"
    return "theory" if name.startswith("posenc.theory") else "apps"


def imported(src: str) -> list[str]:
    """Absolute names a source imports, ``from m import n`` as ``m.n`` (lazy imports too; posenc's own imports are
    absolute)."""
    out = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [f"{node.module}.{a.name}" for a in node.names]
    return out


def summary(commit: str, mods: dict[str, str]) -> list[str]:
    """Per layer: modules, lines, the posenc modules its modules import (one per importing and imported module) by
    the imported one's layer, the third-party packages imported."""
    lines, count, edges, third = Counter(), Counter(), Counter(), {L: set() for L in LAYERS}
    for name, src in mods.items():
        L = layer(name)
        lines[L] += len(src.splitlines())
        count[L] += 1
        targets = set()
        for target in imported(src):
            if target.startswith("posenc"):
                while (
                    target not in mods and "." in target
                ):  # "posenc.rope.NAME" -> "posenc.rope"; "posenc.hf.scheme" stays
                    target = target.rsplit(".", 1)[0]
                targets.add(target)
            elif target.split(".")[0] not in sys.stdlib_module_names and target != "__future__":
                third[L].add(target.split(".")[0])
        for target in targets - {name}:
            edges[(L, layer(target))] += 1
    out = [
        f"commit {commit} ({git('rev-parse', '--short', commit).strip()}): "
        f"{len(mods)} modules, {sum(lines.values())} lines"
    ]
    for L in LAYERS:
        into = ", ".join(f"{b} {edges[(L, b)]}" for b in LAYERS if edges[(L, b)])
        out.append(
            f"  {L}: {count[L]} modules, {lines[L]} lines; imports of posenc modules: {into}; "
            f"third-party: {', '.join(sorted(third[L]))}"
        )
    return out


def table(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Markdown rows: module, its layer (today's rule), lines before and after ('-': absent)."""
    rows = ["| module | layer | lines before | lines after |", "|---|---|---:|---:|"]
    for name in sorted(set(before) | set(after), key=lambda n: (LAYERS.index(layer(n)), n)):
        b, a = (str(len(m[name].splitlines())) if name in m else "-" for m in (before, after))
        rows.append(f"| {name.removeprefix('posenc.') or 'posenc'} | {layer(name)} | {b} | {a} |")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("commits", nargs="+", help="one commit, or BEFORE AFTER")
    p.add_argument("--out", type=Path, help="with two commits: write the markdown here")
    args = p.parse_args()
    mods = [sources(c) for c in args.commits[:2]]
    text = [line for c, m in zip(args.commits, mods) for line in summary(c, m)]
    if len(mods) == 2:
        text = ["# Module map of src/posenc", "", "```", *text, "```", "", *table(*mods)]
    print("\n".join(text))
    if args.out:
        args.out.write_text("\n".join(text) + "\n")


if __name__ == "__main__":
    main()
