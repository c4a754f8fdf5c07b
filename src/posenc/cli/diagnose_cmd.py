"""`posenc diagnose RUN_DIR`: far attention mass, attention entropy and step spectral gaps of a trained run."""

from pathlib import Path

from posenc.cli.common import OUT, nonblank, once
from posenc.eval.diagnose import DEFAULT_MULTIPLES, diagnose_model
from posenc.reports.diagnose import write_outputs
from posenc.store.checkpoint import check_run_dir, refuse_run_dir
from posenc.store.lock import hold_run_dir, hold_to_read
from posenc.train.distributed import check_device
from posenc.train.rundir import load_text_run, run_tokens


def add_parser(sub):
    p = sub.add_parser(
        "diagnose",
        help="attention diagnostics of a trained run: far mass, entropy, spectral gap (tables and plots)",
        description="Per layer and head: attention mass on keys at distance >= w and attention entropy against "
        "evaluation length; for schemes with phases, the spectral gap of the step angles "
        "(a study loaded with posenc --import may add columns).",
    )
    p.add_argument("run_dir", type=nonblank(Path))
    p.add_argument("--out", type=OUT, help="output folder (default RUN_DIR/diagnose; not another run's folder)")
    p.add_argument(
        "--multiples",
        type=int,
        nargs="+",
        default=list(DEFAULT_MULTIPLES),
        help="lengths as multiples of the training length",
    )
    p.add_argument("--window", type=int, help="far keys are at distance >= this (default: the training length)")
    p.add_argument("--windows", type=int, default=2, help="held-out windows per length (default %(default)s)")
    p.add_argument("--corpus", type=nonblank(), help="diagnose on another corpus's held-out documents")
    p.add_argument("--device", type=nonblank(), default="cpu", help="torch device (default cpu)")
    p.set_defaults(func=run)


def run(args) -> int:
    device = check_device(args.device)
    once("--multiples", args.multiples)
    out = args.out or Path(args.run_dir) / "diagnose"
    check_run_dir(out)  # before the work: a file in the way is one line, not a traceback after it
    refuse_run_dir(out, "diagnose")  # another run's folder: its plots (far_mass.png) would be replaced
    hold_to_read(args.run_dir)  # a run being trained is refused, and none starts while it is read (posenc.store.lock)
    hold_run_dir(out)  # an existing one held now: another writer, or a read-only folder, refused before the work
    model, _, tcfg = load_text_run(args.run_dir, "diagnose")
    data = run_tokens(args.run_dir, tcfg, args.corpus)
    res = diagnose_model(model.to(device), data.val_docs, args.multiples, args.window, args.windows)
    paths = write_outputs(res, out)
    print(paths[0].read_text())
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0
