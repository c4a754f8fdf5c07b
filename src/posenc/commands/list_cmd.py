"""`posenc list`: the registered schemes by family (with their sources) and the presets."""

from posenc import encodings
from posenc.presets import preset_names
from posenc.tasks import TASKS
from posenc.extend import preset_names as extend_presets
from posenc.finetune import preset_names as finetune_presets


def add_parser(sub):
    p = sub.add_parser("list", help="list positional schemes (by family, with sources) and presets")
    p.set_defaults(func=run)


def run(args) -> int:
    print("schemes (parameters with ':', parts with '+', layers with '|', e.g. acc-rand-qkv:a=0.3+alibi, rope|rope|rope|nope):")
    for family, rows in encodings.catalogue().items():
        print(f"\n{family}:")
        for name, doc, source in rows:
            print(f"  {name:18s} {doc}" + (f" [{source}]" if source else ""))
    print("\nsynthetic tasks (--corpus, a preset's tasks; e.g. flipflop:p_ignore=0.9, mqar:pairs=8,gap=0-96):")
    for name, cls in TASKS.items():
        params = ", ".join(f"{k}={default}" for k, (_, default) in cls.params.items())
        print(f"  {name:18s} {cls.__doc__.strip().splitlines()[0]} ({params})")
    print("\npresets: " + ", ".join(preset_names()))
    print("extend presets (posenc extend --preset): " + ", ".join(extend_presets()))
    print("finetune presets (posenc finetune --preset): " + ", ".join(finetune_presets()))
    return 0
