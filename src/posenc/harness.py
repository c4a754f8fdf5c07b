"""posenc's model in lm-evaluation-harness: ``import posenc.harness`` registers it as ``posenc``
(``lm_eval.simple_evaluate(model="posenc", model_args=...)``); ``python -m posenc.harness ARGS`` is lm-eval's own
command (``lm-eval run --model posenc --model_args pretrained=... --tasks ...``) with it registered, since lm-eval
0.4.13 finds no model of another package by itself. The model: ``posenc.jobs.harness.PosencLM``. Needs the
``harness`` extra (``pip install 'posenc[harness]'``).
"""

from __future__ import annotations

import sys

from posenc.errors import PosencError

try:
    from posenc.jobs.harness import PosencLM
except ImportError as exc:  # lm-eval missing: say which extra brings it
    raise ImportError(f"posenc.harness needs lm-eval: pip install 'posenc[harness]' ({exc})") from exc

__all__ = ["PosencLM", "main"]


def main(argv: list[str] | None = None) -> int:
    """lm-eval's command line on ``argv`` (default: this process's arguments) with the ``posenc`` model registered;
    a PosencError (bad model_args, a request past what the adaptation reaches) is one line and exit code 2."""
    from lm_eval.__main__ import cli_evaluate

    sys.argv = ["lm-eval", *(sys.argv[1:] if argv is None else argv)]
    try:
        cli_evaluate()
    except PosencError as exc:
        print(f"posenc: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
