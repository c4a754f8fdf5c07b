"""Which gap-MQAR queries a trained model answers: accuracy by query index, and what its wrong answers are.

A model that binds each key to its value answers every query; one that answers each query with a value of the
context not yet given (the elimination shortcut of ``queries=all``, where every key is asked once) is exact on the
last query and right 1/k of the time on the k-th from last. This prints, for 512 held-out rows at the training
length, the accuracy at each query index and the share of wrong answers that are another pair's value.

    .venv/bin/python experiments/accumulated/mqar_queries.py RUN_DIR TASK_SPEC [LENGTH]

(``results/retrieval-protocol/gap-mqar-probe3.md`` gives its output for the probes' runs.)
"""

import sys

import torch

from posenc.data.tasks import get_task
from posenc.eval.tasks import EVAL_SEED
from posenc.train.rundir import load_run


def main(run_dir: str, spec: str, length: int = 128) -> None:
    model, task = load_run(run_dir)[0].eval(), get_task(spec)
    P, K, V = (task.values[k] for k in ("pairs", "keys", "values"))
    b = task.batch(EVAL_SEED, 0, range(512), length)
    with torch.no_grad():
        pred = model(b.inputs).argmax(-1)
    rows, cols = b.answer.nonzero(as_tuple=True)
    got, want = pred[rows, cols].view(-1, P), b.targets[rows, cols].view(-1, P)
    print(
        f"{spec}, {len(got)} rows: accuracy by query index",
        [round(x, 3) for x in (got == want).float().mean(0).tolist()],
    )
    values = [
        set(t for t in b.inputs[r, : int(cols.view(-1, P)[r, 0])].tolist() if K <= t < K + V) for r in range(len(got))
    ]
    wrong = [(r, q) for r in range(len(got)) for q in range(P) if got[r, q] != want[r, q]]
    if wrong:
        share = sum(int(got[r, q]) in values[r] for r, q in wrong) / len(wrong)
        print(f"wrong answers that are another pair's value: {share:.3f} of {len(wrong)}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(int(a) for a in sys.argv[3:4]))
