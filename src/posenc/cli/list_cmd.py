"""`posenc list`: the registered schemes by family (with their sources and, with --params, their parameters),
the synthetic tasks and the presets; --json: the same as one JSON object, for scripts."""

import json

from posenc import encodings
from posenc.data.tasks import TASKS
from posenc.jobs.extend import preset_names as extend_presets
from posenc.jobs.finetune import preset_names as finetune_presets
from posenc.store.presets import preset_names


def add_parser(sub):
    p = sub.add_parser("list", help="list positional schemes (by family, with sources), synthetic tasks and presets")
    p.add_argument("--params", action="store_true", help="each scheme's parameters: default, meaning and range")
    p.add_argument(
        "--json", action="store_true", help="print one JSON object (every scheme with its parameters, tasks, presets)"
    )
    p.set_defaults(func=run)


def listing() -> dict:
    """Schemes (name, family, doc, source, the alias' spec and fixed parameters or None, the parameters a spec may
    set), tasks (name, doc, parameter defaults) and presets."""
    return {
        "schemes": [
            {
                "name": name,
                "family": family,
                "doc": doc,
                "source": source,
                "alias_of": _alias(name),
                "params": [p._asdict() for p in encodings.parameters(name)],
            }
            for family, rows in encodings.catalogue().items()
            for name, doc, source in rows
        ],
        "tasks": [
            {
                "name": name,
                "doc": cls.__doc__.strip().splitlines()[0],
                "params": {k: d for k, (_, d) in cls.params.items()},
            }
            for name, cls in TASKS.items()
        ],
        "presets": preset_names(),
        "extend_presets": extend_presets(),
        "finetune_presets": finetune_presets(),
    }


def _alias(name: str) -> dict | None:
    target = encodings.alias_of(name)
    return {"spec": target[0], "params": target[1]} if target else None


def run(args) -> int:
    out = listing()
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(
        "schemes (parameters with ':', parts with '+', layers with '|', a layer's sliding window or chunks with "
        "window=W or chunk=C on any part; e.g. acc-rand-qkv:a=0.3+alibi, rope|rope|rope|nope, rope:window=64|nope):"
    )
    family = None
    for s in out["schemes"]:
        if s["family"] != family:
            family = s["family"]
            print(f"\n{family}:")
        print(f"  {s['name']:18s} {s['doc']}" + (f" [{s['source']}]" if s["source"] else ""))
        if args.params and not s["alias_of"]:  # an alias' line names its scheme, whose parameters are listed there
            for p in s["params"]:
                print(f"      {p['name'] + '=' + str(p['default']):24s} {p['doc']}")  # None: the scheme picks (doc)
    print("\nsynthetic tasks (--corpus, a preset's tasks; e.g. flipflop:p_ignore=0.9, mqar:pairs=8,gap=0-96):")
    for t in out["tasks"]:
        print(f"  {t['name']:18s} {t['doc']} ({', '.join(f'{k}={d}' for k, d in t['params'].items())})")
    print("\npresets: " + ", ".join(out["presets"]))
    print("extend presets (posenc extend --preset): " + ", ".join(out["extend_presets"]))
    print("finetune presets (posenc finetune --preset): " + ", ".join(out["finetune_presets"]))
    return 0
