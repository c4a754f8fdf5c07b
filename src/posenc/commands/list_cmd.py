"""`posenc list`: the registered schemes and presets."""

from posenc import encodings
from posenc.compare import preset_names


def add_parser(sub):
    p = sub.add_parser("list", help="list positional schemes and presets")
    p.set_defaults(func=run)


def run(args) -> int:
    print("schemes (parameters with ':', parts with '+', e.g. acc-rand-qkv:a=0.3+alibi):")
    for name, doc in encodings.describe_all().items():
        print(f"  {name:18s} {doc}")
    print("presets: " + ", ".join(preset_names()))
    return 0
