"""The report figures as a reader sees them: buckets.png's points on their ticks, the distance plot's line styles
(dotted: did not learn; dash-dot: mixing window, with its legend entry), identical curves labelled, extend's
per-position plot with a point per bucket at any length."""

import pytest

from posenc.data.tasks import get_task
from posenc.eval.perplexity import bucket_width
from posenc.reports.claims import Quantity
from posenc.reports.pretrained import position_figure, ppl_rows
from posenc.reports.tasks import TaskTable, accuracy_markdown, distance_figure, length_figure, quantity_label
from posenc.reports.text import buckets_figure
from posenc.store.records import Ppl, ScoredWindow, TaskCell
from tests.task_records import task_record, task_table


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
    return task_record(cells, seed, scheme)


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
    window = Quantity("w_0.01", "mixing window w_0.01", lambda m: None)
    values = {window: {"rope": 40.0, "nope": None}}
    ax = distance_figure(t, ["rope", "nope", "alibi"], values, get_task("flipflop").chance).axes[0]
    label = quantity_label(window)
    assert label == "mixing window w_0.01 (dash-dot, in the scheme's colour)"
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
    assert legend[label].get_linestyle() == "-."
    assert list(legend) == [
        "rope",
        "nope (did not learn: dotted)",
        "alibi (same as rope)",
        "training length 128",
        "chance",
        label,
    ]
    assert [line.get_linestyle() for line in ax.get_lines()].count("-.") == 1  # only the window is dash-dot


def test_the_length_plot_has_a_panel_per_test_its_table_shows():
    """The dense test was in the accuracy table but not in length-TASK.png."""
    cells = {(test, L, 8): a for test, a in (("id", 1.0), ("sparse", 0.9), ("dense", 0.7)) for L in (128, 512)}
    t = task_table("flipflop", {"rope": {0: cells}, "alibi": {0: cells}})
    header = accuracy_markdown(t, ["rope", "alibi"]).splitlines()[0]
    assert header == "| scheme | learned | id 1x | id 4x | sparse 1x | sparse 4x | dense 1x | dense 4x |"
    fig = length_figure(t, ["rope", "alibi"], 0.5)
    assert [ax.get_title() for ax in fig.axes] == ["flipflop: id", "flipflop: sparse", "flipflop: dense"]
    dense = fig.axes[2].get_lines()[0]
    assert (list(dense.get_xdata()), list(dense.get_ydata())) == ([128, 512], [70.0, 70.0])


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


def test_sweep_titles_and_legends_lie_inside_the_figure_and_equal_rows_say_so():
    """sweep.png centred a one-line title over the panel: a long task spec ran off the figure's left edge."""
    from posenc.config.plan import point_label
    from posenc.jobs.sweep import Choice
    from posenc.reports.sweep import sensitivity_figure

    mqar = "mqar:pairs=4,keys=8,values=8,filler=16,gap=0-64"

    def choice(task, scheme, acc):
        points = [(("train.lr", lr),) for lr in (1e-3, 3e-3)]
        results = {point_label(p): a for p, a in zip(points, acc)}
        return Choice(task, scheme, points, results, dict.fromkeys(results), 0.9)

    rows = [("nope", (0.9, 0.95)), ("rope", (0.9, 0.95)), ("hybrid as acc-learned-qkv+forget:init_bias=4", (1, 1))]
    for tasks in ([mqar], ["flipflop", mqar]):
        fig = sensitivity_figure([choice(task, s, acc) for task in tasks for s, acc in rows], 0, 0.9)
        fig.canvas.draw()
        renderer, box = fig.canvas.get_renderer(), fig.bbox
        for ax in fig.axes:
            for artist in (ax.title, ax.get_legend()):
                extent = artist.get_window_extent(renderer)
                assert box.x0 <= extent.x0 and extent.x1 <= box.x1 and extent.y1 <= box.y1, (tasks, artist)
        labels = [line.get_label() for line in fig.axes[-1].get_lines() if not line.get_label().startswith("_")]
        assert labels[:2] == ["nope", "rope (same as nope)"]


def _diagnosis():
    """Two layers of two heads: layer 1's step angles equal layer 0's, head 0 of layer 0 attends uniformly."""
    from posenc.store.records import Diagnosis, LayerGap, LengthDiagnosis

    uniform = {2: 0.5, 4: 0.75, 8: 0.875}
    lengths = [
        LengthDiagnosis(
            length=16 * m,
            multiple=m,
            windows=1,
            far_mass=[[u, 0.1 * m], [0.2, 0.3]],
            far_mass_bound=[[0.0, 0.0], [0.0, 0.0]],
            uniform_far_mass=u,
        )
        for m, u in uniform.items()
    ]
    beta = [[0.9, 0.8, 0.7], [0.95, 0.85, 0.75]]
    gaps = [LayerGap(layer=i, steps=4, beta=beta, baseline=[0.5] * 3, mean_step=beta) for i in (0, 1)]
    return Diagnosis(
        scheme="acc-rand-qk",
        describe="",
        train_length=16,
        w=16,
        windows_per_length=1,
        lengths=lengths,
        spectral_gap=gaps,
    )


def test_diagnose_plots_keep_equal_curves_visible():
    """spectral_gap.png drew layer 1 over an equal layer 0 and far_mass.png a head over the uniform line, unlabelled."""
    from posenc.reports.diagnose import spectral_gap_figure, vs_length_figure

    res = _diagnosis()
    ax = spectral_gap_figure(res).axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines) == ["layer 0", "layer 1 (same as layer 0)", "step-law baseline"]
    assert lines["layer 1 (same as layer 0)"].get_markersize() < lines["layer 0"].get_markersize()
    assert lines["layer 1 (same as layer 0)"].get_marker() != lines["layer 0"].get_marker()
    fig = vs_length_figure(res, "far_mass", "uniform_far_mass", "far attention mass", "far_mass_bound")
    layer0, layer1 = fig.axes
    labels = [t.get_text() for t in layer0.get_legend().get_texts()]
    assert labels == ["head 0", "head 1", "uniform (same as head 0)"]
    assert [t.get_text() for t in layer1.get_legend().get_texts()] == ["head 0", "head 1", "uniform"]
    uniform = next(line for line in layer0.get_lines() if line.get_label() == "uniform (same as head 0)")
    head0 = layer0.get_lines()[0]
    assert list(uniform.get_ydata()) == [0.5, 0.75, 0.875] and uniform.get_zorder() > head0.get_zorder()
    assert (uniform.get_linestyle(), uniform.get_marker(), head0.get_linestyle(), head0.get_marker()) == (
        "--",
        "",
        "-",
        "o",
    )
