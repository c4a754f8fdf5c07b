"""`posenc eval RUN_DIR`: perplexity against evaluation length for one trained run."""

from pathlib import Path

from posenc.checkpoint import append_jsonl
from posenc.data import load_tokens
from posenc.evaluate import eval_lengths, evaluate_length
from posenc.train import load_run


def add_parser(sub):
    p = sub.add_parser("eval", help="evaluate a trained run: perplexity vs evaluation length")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--multiples", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64], help="lengths as multiples of the training length")
    p.add_argument("--max-tokens", type=int, default=32768, help="scored tokens per length")
    p.add_argument("--corpus", help="evaluate on another corpus's held-out documents")
    p.set_defaults(func=run)


def run(args) -> int:
    model, mcfg, tcfg = load_run(args.run_dir)
    data = load_tokens(args.corpus or tcfg.corpus, tcfg.tokenizer)
    base = None
    print(f"{'length':>8} {'windows':>8} {'tokens':>8} {'ppl':>10} {'ratio':>7}")
    for L in eval_lengths(mcfg.train_length, args.multiples):
        rec = evaluate_length(model, data.val_docs, L, args.max_tokens)
        append_jsonl(Path(args.run_dir) / "eval.jsonl", {"scheme": mcfg.encoding, "train_length": mcfg.train_length, **rec})
        if rec["ppl"] is None:
            print(f"{L:>8} {'':>8} {'':>8} {'n/a':>10}")
            continue
        base = base or (rec["ppl"] if L == mcfg.train_length else None)
        ratio = f"{rec['ppl'] / base:7.3f}" if base else ""
        print(f"{L:>8} {rec['windows']:>8} {rec['scored_tokens']:>8} {rec['ppl']:>10.3f} {ratio}")
    return 0
