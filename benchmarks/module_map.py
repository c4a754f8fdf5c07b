"""Module map of src/posenc at a commit: modules and lines per layer (core, theory, apps), import edges between layers.

    python3 benchmarks/module_map.py COMMIT     (e.g. 964e4ff^ and HEAD: before and after issue 25)
"""
import ast, subprocess, sys
from collections import Counter
commit = sys.argv[1]
repo = str(__import__("pathlib").Path(__file__).resolve().parents[1])
files = [f for f in subprocess.run(["git", "-C", repo, "ls-tree", "-r", "--name-only", commit, "src/posenc"], capture_output=True, text=True).stdout.split() if f.endswith(".py")]
CORE = ("posenc.errors", "posenc.attention", "posenc.scoring", "posenc.layer", "posenc.model", "posenc.encodings", "posenc.rope")
def name(f):
    parts = f[len("src/"):-3].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
def layer(n):
    if n == "posenc" or any(n == p or n.startswith(p + ".") for p in CORE): return "core"
    if n.startswith("posenc.theory"): return "theory"
    return "apps"
mods = {name(f): subprocess.run(["git", "-C", repo, "show", f"{commit}:{f}"], capture_output=True, text=True).stdout for f in files}
lines = Counter(); count = Counter(); edges = Counter(); ext = Counter()
for n, src in mods.items():
    L = layer(n); lines[L] += len(src.splitlines()); count[L] += 1
    for node in ast.walk(ast.parse(src)):
        targets = []
        if isinstance(node, ast.Import): targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0: targets = [node.module]
        for t in targets:
            if t.startswith("posenc"):
                while t not in mods and "." in t: t = t.rsplit(".", 1)[0]
                edges[(L, layer(t))] += 1
            else:
                ext[(L, t.split(".")[0])] += 1
print(f"commit {commit}: {len(mods)} modules, {sum(lines.values())} lines")
for L in ("core", "theory", "apps"):
    heavy = sorted({m for (l, m), c in ext.items() if l == L and m not in sys.stdlib_module_names})
    print(f"  {L}: {count[L]} modules, {lines[L]} lines; imports posenc " + ", ".join(f"{b} {c}" for (a, b), c in sorted(edges.items()) if a == L) + f"; third-party: {', '.join(heavy)}")
big = sorted(((len(s.splitlines()), n) for n, s in mods.items()), reverse=True)[:8]
print("  largest: " + ", ".join(f"{n.removeprefix('posenc.')} {l}" for l, n in big))
