"""`posenc generate RUN_DIR --prompt TEXT`: continue a prompt with a trained run (KV-cache decoding)."""

from pathlib import Path

import torch

from posenc.data import load_tokens
from posenc.errors import PosencError
from posenc.model import set_method
from posenc.train import load_run


def add_parser(sub):
    p = sub.add_parser("generate", help="generate text from a trained run (incremental decoding with a KV cache)")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--max-new-tokens", type=int, default=200, help="tokens to generate (default %(default)s)")
    p.add_argument("--temperature", type=float, default=0.8, help="sampling temperature; 0 is greedy (default %(default)s)")
    p.add_argument("--top-k", type=int, help="sample from the k most likely tokens only")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default %(default)s)")
    p.add_argument("--method", metavar="SPEC", help="a long-context method (posenc eval --help), e.g. sinks:n_sink=4,window=124: "
                   "attention sinks keep the cache at n_sink + window positions")
    p.set_defaults(func=run)


def run(args) -> int:
    if not args.prompt:
        raise PosencError("--prompt is empty: give the text to continue")
    model, _, tcfg = load_run(args.run_dir)
    set_method(model, args.method)
    tok = load_tokens(tcfg.corpus, tcfg.tokenizer).tokenizer
    ids = torch.as_tensor(tok.encode(args.prompt).astype("int64"), device=next(model.parameters()).device)
    out = model.generate(ids, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, seed=args.seed)
    print(tok.decode(out.tolist()))
    return 0
