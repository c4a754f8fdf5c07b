"""The grid's edge: a sweep whose chosen value sits at the lowest or highest value of a numeric grid axis (more than
one value) says so in the report's chosen-setting table; inside the grid, or on a one-value or non-numeric axis, not."""

from posenc.config.plan import point_label
from posenc.jobs.sweep import Choice
from posenc.reports.sweep import chosen_cell, sweep_markdown

LRS = [3e-4, 1e-3, 3e-3]


def _choice(best: int, own=((),), task="flipflop"):
    """A synthetic sweep over LRS (x ``own`` settings): the point at LRS[best] (first own value) scores 0.99."""
    points = [(("train.lr", lr), *o) for lr in LRS for o in own]
    results = {point_label(p): 0.5 for p in points}
    results[point_label(points[best * len(own)])] = 0.99
    return Choice(task, "rope", points, results, dict.fromkeys(results), 0.9)


def _row(text: str, scheme: str = "rope") -> str:
    return next(line for line in text.splitlines() if line.startswith(f"| flipflop | {scheme} |"))


def test_a_choice_at_each_edge_says_so_and_one_inside_does_not():
    low, inside, high = _choice(0), _choice(1), _choice(2)
    assert (low.edges(), inside.edges(), high.edges()) == ({"train.lr": "lowest"}, {}, {"train.lr": "highest"})
    assert chosen_cell(low) == "train.lr=0.0003 (lowest of the grid)"
    assert chosen_cell(inside) == "train.lr=0.001" == inside.setting()
    assert chosen_cell(high) == "train.lr=0.003 (highest of the grid)"
    for c, cell in (
        (low, "train.lr=0.0003 (lowest of the grid)"),
        (inside, "train.lr=0.001"),
        (high, "train.lr=0.003 (highest of the grid)"),
    ):
        text = "\n".join(sweep_markdown([c], 0, None))
        assert _row(text) == f"| flipflop | rope | {cell} | 99.0 |"
    assert "the optimum may lie beyond the grid" in "\n".join(sweep_markdown([low], 0, None))


def test_each_numeric_axis_is_read_on_its_own_and_others_are_not_edges():
    heads = _choice(1, own=((("model.n_head", 4),), (("model.n_head", 2),)))  # lr inside; 4 heads, the highest
    assert heads.edges() == {"model.n_head": "highest"}
    assert chosen_cell(heads) == "train.lr=0.001, model.n_head=4 (highest of the grid)"
    variant = _choice(0, own=((("model.encoding", "forget"),), (("model.encoding", "forget:init_bias=4"),)))
    assert variant.edges() == {"train.lr": "lowest"}  # a variant axis is not numeric: no edge
    one = _choice(0, own=((("model.n_head", 4),),))  # an axis of one value has no edge
    assert one.edges() == {"train.lr": "lowest"}
    assert chosen_cell(one) == "train.lr=0.0003 (lowest of the grid), model.n_head=4"


def test_no_choice_has_no_edge():
    c = Choice("flipflop", "rope", [(("train.lr", lr),) for lr in LRS], {f"train.lr={lr}": 0.5 for lr in LRS}, {}, 0.9)
    assert c.point is None and c.edges() == {}
    assert (
        chosen_cell(c)
        == c.setting()
        == ("none chosen: did not learn at any grid point (reported at its best, train.lr=0.0003)")
    )
    text = Choice(
        None,
        "rope",
        [(("train.lr", 1e-3),), (("train.lr", 3e-3),)],
        {"train.lr=0.001": 7.0, "train.lr=0.003": 6.0},
        {},
        None,
    )
    assert chosen_cell(text) == "train.lr=0.003 (highest of the grid)"  # text: the lower perplexity
