"""``posenc harness``: lm-evaluation-harness tasks (RULER's needle tasks, ...) over several adaptations and lengths
of a pretrained model, one table and plot (the job is ``posenc.jobs.harness.grid``).

Each adaptation is posenc's model in lm-eval (``posenc.jobs.harness.PosencLM``); each cell (adaptation, task,
length) is one ``lm_eval.simple_evaluate`` call whose score comes with its 95% Wilson interval and sample count.
Resumable: a finished cell is kept in OUT/cells, a killed one resumes from lm-eval's request cache (OUT/cache).
lm-eval's own command with the posenc model: ``python -m posenc.harness run --model posenc --model_args ...``
(docs/harness.md). Needs the harness extra: pip install 'posenc[harness]'.
"""

from __future__ import annotations

from posenc.cli.common import OUT, add_dtype, nonblank
from posenc.errors import PosencError
from posenc.hf.loading import check_model


def add_parser(sub) -> None:
    p = sub.add_parser(
        "harness",
        help="lm-evaluation-harness tasks (RULER) over adaptations and lengths: one table and plot",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument(
        "--model",
        type=nonblank(),
        default="smollm2",
        help="'smollm2' (default: SmolLM2-135M-Instruct GGUF), a .gguf file, a model directory, a hub id, or a posenc "
        "finetune or train run directory",
    )
    p.add_argument("--tasks", nargs="+", required=True, metavar="TASK", help="lm-eval task names (niah_single_1 ...)")
    p.add_argument(
        "--lengths", type=int, nargs="+", required=True, metavar="TOKENS", help="RULER lengths (max_seq_lengths)"
    )
    p.add_argument(
        "--adaptations",
        nargs="+",
        default=["none"],
        metavar="SPEC",
        help="none; a RoPE schedule NAME[:setting=v,...] (yarn:factor=2); a method (self-extend:group=8,window=1024), "
        "on a schedule as SCHEDULE+METHOD; scheme:SPEC (default: none)",
    )
    p.add_argument("--limit", type=int, help="samples per task and length (default: all the task has)")
    p.add_argument(
        "--tokenizer",
        type=nonblank(),
        help="what RULER sizes its prompts with (default: the model's, saved to OUT/tokenizer)",
    )
    add_dtype(p, note="; a folder holds one dtype's cells")
    p.add_argument("--out", type=OUT, required=True, help="output directory (rerun the command to resume)")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.limit is not None and args.limit < 1:
        raise PosencError(f"--limit must be >= 1 sample, got {args.limit}")
    if min(args.lengths) < 1:
        raise PosencError(f"--lengths must be >= 1 token, got {min(args.lengths)}")
    for flag, given in (("--lengths", args.lengths), ("--tasks", args.tasks), ("--adaptations", args.adaptations)):
        if twice := sorted({str(x) for x in given if given.count(x) > 1}):  # a column or row of the table twice
            raise PosencError(f"{flag}: each entry once, {', '.join(twice)} repeated")
    try:
        from posenc.jobs import harness
    except ImportError as exc:
        raise PosencError(f"posenc harness needs lm-eval: pip install 'posenc[harness]' ({exc})") from None
    check_model(args.model)  # before the output directory is made
    unknown = [t for t in args.tasks if t not in harness.task_index()]  # lm-eval raises a KeyError deep inside
    if unknown:
        raise PosencError(f"--tasks: {', '.join(unknown)} is not an lm-eval task, group or tag (lm-eval ls tasks)")
    table = harness.grid(
        args.model, args.tasks, args.lengths, args.adaptations, args.out, args.limit, args.tokenizer, args.dtype
    )
    print(table)
    print(f"results in {args.out}/")
    return 0
