"""posenc.reports.render: markdown tables, Agg figures written atomically, readable log ticks, identical curves
visible."""

import math

import matplotlib.pyplot as plt
import pytest

from posenc.reports.render import (
    MISSING,
    PCT,
    PPL,
    RATIO,
    figure,
    log_scale,
    log_ticks,
    markdown_table,
    number,
    plain_number,
    plot_lines,
    same_as,
    save_figure,
    seed_cell,
)


def test_markdown_table_escapes_pipes_and_keeps_empty_cells_narrow():
    md = markdown_table(["a", "b c", 3], [["x|y", "", 1.5], [None, "z", "**w**"]])
    assert md.splitlines() == ["| a | b c | 3 |", "|---|---|---|", "| x\\|y | | 1.5 |", "| None | z | **w** |"]
    assert markdown_table(["only"], []) == "| only |\n|---|"


def labelled_ticks(ax, which: str) -> list[tuple[float, str]]:
    """(position rounded to 6 digits, label) of the ticks a reader sees on ``ax``'s ``which`` axis: labelled and
    inside the view, after drawing."""
    ax.figure.canvas.draw()
    axis = getattr(ax, f"{which}axis")
    lo, hi = sorted(axis.get_view_interval())
    ticks = axis.get_major_ticks() + axis.get_minor_ticks()
    return sorted(
        (round(float(t.get_loc()), 6), t.label1.get_text())
        for t in ticks
        if lo * (1 - 1e-9) <= t.get_loc() <= hi * (1 + 1e-9) and t.label1.get_visible() and t.label1.get_text()
    )


def test_figures_are_agg_written_atomically_without_pyplot(tmp_path):
    fig, axes = figure(1, 2, figsize=(4, 3), squeeze=False)
    assert axes.shape == (1, 2) and fig.get_size_inches().tolist() == [4, 3]
    axes[0][0].plot([1, 2, 1000], [1, 2, 3])
    log_scale(axes[0][0], "x")
    assert axes[0][0].get_xscale() == "log"
    # under 3,000x: 1-2-5 in each decade, plain numbers; the minor ticks carry no label
    assert [label for _, label in labelled_ticks(axes[0][0], "x")] == [
        "1",
        "2",
        "5",
        "10",
        "20",
        "50",
        "100",
        "200",
        "500",
        "1000",
    ]
    path = save_figure(fig, tmp_path / "f.png", dpi=50)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and [p.name for p in tmp_path.iterdir()] == ["f.png"]
    assert plt.get_fignums() == []  # no pyplot figure left open


@pytest.mark.parametrize(
    "lo,hi,base,labels",
    [
        (1, 2, 10, ["1", "1.2", "1.4", "1.6", "1.8", "2"]),  # inside one decade: a linear ladder, not just "1" and "2"
        (0.9, 1.1, 10, ["0.9", "0.95", "1", "1.05", "1.1"]),
        (1, 100, 10, ["1", "2", "5", "10", "20", "50", "100"]),
        (
            1e-3,
            1e6,
            10,
            ["0.001", "0.01", "0.1", "1", "10", "100", "1000", "10000", "100000", "1000000"],
        ),  # decades only
        (1, 8, 2, ["1", "2", "4", "8"]),
        (1, 3, 2, ["1", "1.5", "2", "2.5", "3"]),
        (1.5, 1.7, 10, ["1.5", "1.55", "1.6", "1.65", "1.7"]),
        (2**10, 2**20, 2, [str(2**k) for k in range(10, 21)]),  # integers in full: 1048576, not 1.04858e+06
        (1, 2**30, 2, [str(2**k) for k in range(0, 31, 3)]),  # over 12 powers: every 3rd (31 powers / 12)
    ],
)
def test_log_axes_label_at_least_three_ticks_at_any_range(lo, hi, base, labels):
    fig, ax = figure(figsize=(4, 6))
    ax.plot([1, 2], [lo, hi])
    log_scale(ax, "y", base=base)
    ax.set_ylim(lo, hi)
    seen = labelled_ticks(ax, "y")
    assert [label for _, label in seen] == labels
    assert all(math.isclose(float(label), pos, rel_tol=1e-5) for pos, label in seen)  # each label names its position
    ticks = log_ticks(lo, hi, base)
    assert ticks[0] <= lo * (1 + 1e-9) and ticks[-1] >= hi * (1 - 1e-9)  # the ticks cover the view


def test_plain_number():
    assert [plain_number(v) for v in (2.0, 1048576.0, 0.25, 1.5e-7)] == ["2", "1048576", "0.25", "1.5e-07"]


def test_identical_curves_stay_visible_and_say_so():
    fig, ax = figure(figsize=(4, 3))
    lines = [
        {"label": "a", "x": [1, 2, 4], "y": [1.0, 2.0, 3.0]},
        {"label": "b", "x": [1, 2, 4], "y": [1.0, 2.0, 3.0 * (1 + 1e-9)]},  # a within rounding
        {"label": "c", "x": [1, 2, 4], "y": [1.0, 2.0, 3.1]},  # differs at one point
        {"label": "d", "x": [1, 2, 4], "y": [1.0, 2.0, 3.0], "ms": 4, "ls": "--"},  # a again, own style kept
        {"label": "e", "x": [1, 2], "y": [1.0, 2.0]},
    ]  # fewer points: another curve
    assert same_as([(ln["label"], ln["x"], ln["y"]) for ln in lines]) == {"b": "a", "d": "a"}
    drawn = plot_lines(ax, lines)
    seen = [(ln.get_label(), ln.get_linestyle(), ln.get_marker(), round(ln.get_markersize(), 3)) for ln in drawn]
    assert seen == [
        ("a", "-", "o", 5),
        ("b (same as a)", "--", "s", 3.5),
        ("c", "-", "o", 5),
        ("d (same as a)", "--", "^", 1.96),
        ("e", "-", "o", 5),
    ]  # 2nd repeat: 0.7^2 x its own size 4
    assert [ln.get_zorder() for ln in drawn] == sorted(
        ln.get_zorder() for ln in drawn
    )  # each repeat drawn over the first
    assert same_as([("a", [1, 2], [1.0, None]), ("b", [1, 2], [1.0, float("nan")])]) == {"b": "a"}  # a gap equals a gap


def test_nearly_identical_curves_and_repeated_colours_stay_visible():
    fig, ax = figure(figsize=(4, 3))
    lines = [
        {"label": "a", "x": [1, 2], "y": [1.0, 0.99], "color": "C0"},
        {"label": "b", "x": [1, 2], "y": [1.0, 0.995], "color": "C1"},  # within 1% of a: it would hide under it
        {"label": "c", "x": [1, 2], "y": [1.0, 0.9], "color": "C0"},  # a's colour again (more lines than colours)
        {"label": "d", "x": [1, 2], "y": [1.0, 0.8], "color": "C0"},
    ]
    seen = [
        (ln.get_label(), ln.get_linestyle(), ln.get_marker(), round(ln.get_markersize(), 3))
        for ln in plot_lines(ax, lines)
    ]
    assert seen == [
        ("a", "-", "o", 5),
        ("b (within 1% of a)", "--", "s", 3.5),
        ("c", "-", "s", 5),  # a's colour, style and marker: the first free marker shape
        ("d", "-", "^", 5),
    ]


def test_each_kind_of_value_has_one_rendering_in_every_report():
    """The sweep table printed a text perplexity with three digits (every other table two) and a missing result as
    "—", extend's report as "-" (everywhere else "n/a"); the distance table's bucket columns read 1024 beside
    horizons of 1,024."""
    from posenc.reports.pretrained import markdown as extend_markdown
    from posenc.reports.sweep import _value
    from posenc.reports.tasks import distance_markdown
    from tests.task_records import gap_cells, task_table

    assert _value(None, 12.3456) == seed_cell([12.3456], PPL) == number(12.3456, PPL) == "12.35"
    assert _value("flipflop", 0.98765) == seed_cell([98.765], PCT) == "98.8"
    assert _value(None, None) == _value("flipflop", None) == seed_cell([]) == number(float("nan"), RATIO) == MISSING
    ppl = [{"adaptation": "none", "length": 512, "ppl": 9.876, "scored_tokens": 511, "windows": 1}]
    table = extend_markdown(ppl, [], ["none", "yarn"], "# extend")
    assert "| none | 9.88 |" in table and "| yarn | n/a |" in table and "| yarn | - |" not in table
    t = task_table("flipflop", {"path": {0: gap_cells(1.0, {8: 1.0, 1024: 1.0, 4096: 0.5})}})
    assert distance_markdown(t, ["path"], {}).splitlines()[0] == "| scheme | id 1x | 8 | 1,024 | 4,096 | horizon |"


def test_a_long_spec_label_is_collapsed_and_wrapped_a_short_one_kept():
    """The catalogue-IV run's Llama 4 pattern (160 characters) pushed the ratio plot's axes off the figure."""
    from posenc.reports.render import short_label

    entry = "rope:rope_theta=500000,pairing=adjacent,chunk=64"
    assert short_label(f"{entry}|{entry}|{entry}|llama4-temp:floor_scale=64") == (
        "3 x rope:rope_theta=500000,pairing=adjacent,\nchunk=64 | llama4-temp:floor_scale=64"
    )
    assert short_label("rope|rope|rope|nope") == "rope|rope|rope|nope"  # short: as written
    assert all(len(line) <= 44 for line in short_label("a" * 10 + "," + "b" * 40 + ",c").splitlines())
    assert short_label("x" * 60) == "x" * 60  # one piece longer than the width stays whole


def test_the_far_mass_section_says_why_a_cell_is_not_measured():
    """A learned table's far-mass cells past its rows showed a bare n/a in compare's report; the reason was dropped."""
    from posenc.reports.text import far_mass_markdown
    from posenc.store.records import FarMass

    why = "n/a: learned positions cover 32 tokens, got 64"
    recs = [
        FarMass(scheme="rope", seed=0, train_length=32, length=64, far_mass_mean=0.25, uniform_far_mass=0.5, w=32),
        FarMass(scheme="learned", seed=0, train_length=32, length=64, note=why),
    ]
    out = far_mass_markdown(recs, 32)
    assert "| learned | n/a |" in out and out.endswith(f"\n- learned at 64: {why}\n")
