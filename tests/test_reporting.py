"""posenc.reporting: markdown tables, Agg figures written atomically, plain log ticks."""

import matplotlib.pyplot as plt

from posenc.reporting import figure, log_scale, markdown_table, save_figure


def test_markdown_table_escapes_pipes_and_keeps_empty_cells_narrow():
    md = markdown_table(["a", "b c", 3], [["x|y", "", 1.5], [None, "z", "**w**"]])
    assert md.splitlines() == ["| a | b c | 3 |", "|---|---|---|", "| x\\|y | | 1.5 |", "| None | z | **w** |"]
    assert markdown_table(["only"], []) == "| only |\n|---|"


def test_figures_are_agg_written_atomically_without_pyplot(tmp_path):
    fig, axes = figure(1, 2, figsize=(4, 3), squeeze=False)
    assert axes.shape == (1, 2) and fig.get_size_inches().tolist() == [4, 3]
    axes[0][0].plot([1, 2, 1000], [1, 2, 3])
    log_scale(axes[0][0], "x")
    fig.canvas.draw()
    major, minor = axes[0][0].xaxis.get_major_formatter(), axes[0][0].xaxis.get_minor_formatter()
    assert axes[0][0].get_xscale() == "log" and major(100, 0) == "100" and major(1, 0) == "1"
    assert minor(20, 0) == "20" and minor(30, 0) == ""  # a span of decades: only 2x and 5x minor labels
    path = save_figure(fig, tmp_path / "f.png", dpi=50)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and [p.name for p in tmp_path.iterdir()] == ["f.png"]
    assert plt.get_fignums() == []  # no pyplot figure left open


def test_log_scale_base_2_labels_short_spans_fully():
    fig, ax = figure(figsize=(3, 3))
    ax.plot([1, 2, 4, 8], [1, 1, 1, 1])
    log_scale(ax, "x", base=2)
    ax.set_xlim(1, 8)
    assert ax.xaxis.get_major_formatter()(4, 0) == "4" and ax.xaxis.get_minor_formatter()(3, 0) == "3"
