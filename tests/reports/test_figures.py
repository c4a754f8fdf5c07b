"""The report figures as a reader sees them: buckets.png's points on their ticks, the distance plot's line styles
(dotted: did not learn; dash-dot: mixing window, with its legend entry), identical curves labelled, extend's
per-position plot with a point per bucket at any length."""

import pytest

from posenc.data.tasks import get_task
from posenc.eval.perplexity import bucket_width
from posenc.reports.compare import buckets_figure
from posenc.reports.pretrained import position_figure, ppl_rows
from posenc.reports.tasks import WINDOW_LABEL, TaskTable, distance_figure
from posenc.store.records import Ppl, ScoredWindow, Task, TaskCell


def test_buckets_sit_on_their_ticks_at_the_bucket_midpoints():
    edges = [0, 16, 32, 64, 128]  # [0, L0), [L0, 2 L0), [2 L0, 4 L0), [4 L0, 8 L0) at L0 = 16
    records = [
        Ppl(scheme="rope", train_length=16, eval_length=128, bucket_edges=edges, bucket_ppl=[5.0, 9.0, 30.0, 80.0]),
        Ppl(scheme="rope", train_length=16, eval_length=64, bucket_edges=edges[:4], bucket_ppl=[5.0, 6.0, 7.0]),
        Ppl(scheme="alibi", train_length=16, eval_length=128, bucket_edges=edges, bucket_ppl=[5.0, 9.0, 30.0, 80.0]),
    ]
    ax = buckets_figure(records, 16).axes[0]
    ax.figure.canvas.draw()
    assert list(ax.get_xticks()) == [0.5, 1.5, 3.0, 6.0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0-1", "1-2", "2-4", "4-8"]
    assert [list(line.get_xdata()) for line in ax.get_lines()] == [[0.5, 1.5, 3.0, 6.0]] * 2  # the longest length only
    assert [line.get_label() for line in ax.get_lines()] == ["rope (L=128)", "alibi (L=128) (same as rope (L=128))"]
    assert ax.get_lines()[1].get_markersize() < ax.get_lines()[0].get_markersize()  # drawn over it, smaller
    assert ax.get_lines()[1].get_marker() != ax.get_lines()[0].get_marker()


def _task(scheme, seed, id_acc, gap):
    cells = [TaskCell(test="id", length=128, bucket=8, n=1000, correct=round(1000 * id_acc), nll=0.0)]
    cells += [
        TaskCell(test="gap", length=b + 129, bucket=b, n=1000, correct=round(1000 * a), nll=0.0) for b, a in gap.items()
    ]
    return Task(
        task="flipflop",
        scheme=scheme,
        seed=seed,
        train_length=128,
        train_seconds=1,
        eval_seconds=1,
        threads=1,
        cells=cells,
    )


def test_distance_plot_dotted_means_did_not_learn_and_dash_dot_the_mixing_window():
    gap = {8: 0.98, 64: 0.9, 512: 0.6}
    t = TaskTable(
        [
            _task("rope", 0, 0.98, gap),
            _task("nope", 0, 0.6, {8: 0.6, 64: 0.55, 512: 0.5}),
            _task("alibi", 0, 0.98, gap),
        ],
        "flipflop",
        128,
        0.05,
        0.9,
    )
    ax = distance_figure(t, ["rope", "nope", "alibi"], {"rope": 40.0, "nope": None}, get_task("flipflop").chance).axes[
        0
    ]
    curves = {line.get_label(): line for line in ax.get_lines() if len(line.get_xdata()) == 3}
    assert {k: (v.get_linestyle(), list(v.get_xdata())) for k, v in curves.items()} == {
        "rope": ("-", [8, 64, 512]),
        "nope (did not learn: dotted)": (":", [8, 64, 512]),
        "alibi (same as rope)": ("-", [8, 64, 512]),
    }  # a learned repeat stays solid: dotted keeps one meaning
    window = [line for line in ax.get_lines() if list(line.get_xdata()) == [40.0, 40.0]]
    assert [(w.get_linestyle(), w.get_color()) for w in window] == [("-.", curves["rope"].get_color())]
    legend = {
        text.get_text(): handle for text, handle in zip(ax.get_legend().get_texts(), ax.get_legend().legend_handles)
    }
    assert legend[WINDOW_LABEL].get_linestyle() == "-."
    assert list(legend) == [
        "rope",
        "nope (did not learn: dotted)",
        "alibi (same as rope)",
        "training length 128",
        "chance",
        WINDOW_LABEL,
    ]
    assert [line.get_linestyle() for line in ax.get_lines()].count("-.") == 1  # only the window is dash-dot


@pytest.mark.parametrize("length", [512, 8192])
def test_extend_position_plot_has_a_point_per_bucket_at_any_length(length):
    """``extend --quick`` scores 512-token windows: 32 points of 16 tokens, not one bucket of 1,024."""
    width = bucket_width(length)
    n = length // width
    assert (width, n) == {512: (16, 32), 8192: (256, 32)}[length]
    windows = [
        ScoredWindow(
            key=f"ppl|none|{length}|d|{b}",
            adaptation="none",
            factor=2.0,
            length=length,
            stride=length - 1,
            bos="none",
            doc="d",
            begin=b,
            bucket=width,
            signature="s",
            seconds=1.0,
            nll_sum=float(n),
            n_scored=n * width,
            bucket_nll=[1.0] * n,
            bucket_n=[width] * n,
        )
        for b in (0, length)
    ]
    ax = position_figure(ppl_rows(windows), ["none"]).axes[0]
    (line,) = ax.get_lines()
    assert list(line.get_xdata()) == [(i + 0.5) * width for i in range(n)]
    assert line.get_label() == {512: "none @ 512", 8192: "none @ 8K"}[length]
    assert ax.get_xlabel() == f"position in window (tokens; buckets of {width} tokens, each point at its middle)"
    assert [round(v, 6) for v in line.get_ydata()] == [round(2.718281828 ** (1 / width), 6)] * n  # exp(nll / tokens)
