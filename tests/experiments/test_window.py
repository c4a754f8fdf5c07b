"""The paper's mixing window as the study's quantity (experiments/accumulated/window.py): w_0.01 of each scheme's
random step law, the column and line it adds to the task reports, the text report's section and figure; the library
alone shows none of them."""

import dataclasses
import math

import pytest

from experiments.accumulated.window import LABEL, mixing_window, window_markdown, window_rows
from posenc.config.plan import load_preset
from posenc.model import ModelConfig
from posenc.reports import claims
from posenc.reports.diagnose import markdown as diagnose_markdown
from posenc.reports.text import markdown, with_ratios
from posenc.store.records import Diagnosis, LayerGap, Ppl

L0 = 128


def _model(encoding: str, **kw) -> ModelConfig:
    return ModelConfig(**{"n_layer": 1, "n_head": 2, "d_model": 32, "train_length": 16, "encoding": encoding, **kw})


@pytest.mark.parametrize("a", [0.1, 0.5, 1.0, 2.0, 3.0])
def test_random_step_law_window(a):
    beta = abs(math.sin(a) / a)
    assert mixing_window(_model(f"acc-rand-qkv:a={a}")) == math.ceil(math.log(0.01) / math.log(beta) * (1 - 1e-12))


def test_default_random_steps_mix_inside_the_training_length():
    assert mixing_window(_model("acc-rand-qkv")) == 27
    drift = _model("acc-drift-qkv", n_head=4, d_model=256, train_length=128)
    assert mixing_window(drift) > 1e5  # low-frequency blocks of the RoPE-centred law never mix


def test_a_models_mixing_window_is_its_slowest_layers():
    window = {a: math.ceil(math.log(0.01) / math.log(math.sin(a) / a) * (1 - 1e-12)) for a in (0.5, 1.0)}
    assert window == {0.5: 110, 1.0: 27}
    mcfg = _model("acc-rand-qkv|acc-rand-qkv:a=0.5|rope", n_layer=3)
    assert mixing_window(mcfg) == 110 and mixing_window(dataclasses.replace(mcfg, encoding="acc-rand-qkv|rope")) == 27
    assert mixing_window(dataclasses.replace(mcfg, encoding="rope")) is None  # no step law in any layer


def test_learned_steps_have_no_window_and_a_composite_has_its_rotary_parts():
    """Learned steps' law is known after training only; a composite's window is its rotary part's."""
    assert mixing_window(_model("acc-learned-qkv")) is None and mixing_window(_model("hybrid")) is None
    assert mixing_window(_model("acc-rand-qkv+forget")) == 27 and mixing_window(_model("rope+forget")) is None
    assert mixing_window(_model("acc-token-qkv")) == 27  # per-token steps: the same U[-1, 1] law


def table(rows: dict[str, dict[int, list[float]]]) -> list[Ppl]:
    """scheme -> {multiple: [ppl per seed]} -> ppl records with ratios (seed i is the i-th value)."""
    recs = [
        Ppl(scheme=s, seed=i, train_length=L0, eval_length=m * L0, ppl=p)
        for s, by_m in rows.items()
        for m, ppls in by_m.items()
        for i, p in enumerate(ppls)
    ]
    return with_ratios(recs)


def row(p1: list[float], r16: list[float], r128: list[float]) -> dict[int, list[float]]:
    return {1: p1, 16: [p * r for p, r in zip(p1, r16)], 128: [p * r for p, r in zip(p1, r128)]}


def test_window_section_sorts_by_window_and_predicts_from_the_training_length():
    rows = {f"acc-rand-qkv:a={a}": row([7.0], [1.0 + a / 10], [1.1]) for a in (2, 1, 0.1)}
    windows = {"acc-rand-qkv:a=2": 6, "acc-rand-qkv:a=1": 27, "acc-rand-qkv:a=0.1": 2763, "rope": None}
    got = window_rows(table(rows), windows, L0)
    assert [r["scheme"] for r in got] == ["acc-rand-qkv:a=2", "acc-rand-qkv:a=1", "acc-rand-qkv:a=0.1"]
    assert got[2]["w_ratio"] == pytest.approx(2763 / 128) and got[0]["rmax"] == [pytest.approx(1.1)]
    md = window_markdown(table(rows), windows, L0)
    assert (
        "| acc-rand-qkv:a=1 | 27 | 0.211 | extrapolates |" in md
        and "| acc-rand-qkv:a=0.1 | 2763 | 21.6 | degrades |" in md
    )
    assert window_rows(table(rows), {"acc-rand-qkv:a=2": 6, "acc-rand-qkv:a=1": 27}, L0) == []  # fewer than 3 windows


def test_the_study_adds_the_window_to_the_reports_and_the_library_alone_does_not(accumulated_claims):
    """The window section, window.png and the w_0.01 values come from the study's claim set; unregistered, the
    text report has none of them and the task reports' quantities are empty."""
    rows = {f"acc-rand-qkv:a={a}": row([7.0], [1.0 + a / 10], [1.1]) for a in (2, 1, 0.1)}
    windows = {"acc-rand-qkv:a=2": 6, "acc-rand-qkv:a=1": 27, "acc-rand-qkv:a=0.1": 2763}
    meta = {"name": "t", "train_length": L0, "quantities": {LABEL: windows}}
    md = markdown(table(rows), {}, meta)
    assert "## Mixing window vs extrapolation" in md and "`window.png`" in md
    preset = load_preset("retrieval", {"schemes": ["rope", "acc-rand-qkv"]})
    assert claims.scheme_quantities(preset) == {LABEL: {"rope": None, "acc-rand-qkv": 27}}
    claims.unregister_claims(accumulated_claims.name)
    md = markdown(table(rows), {}, meta)
    assert "Mixing window" not in md and "window.png" not in md
    assert claims.scheme_quantities(preset) == {}


def _diagnosis() -> Diagnosis:
    """One layer, one head, three blocks: beta 1 (never mixes), 0.5 (w_0.01 = 7) and sin 1 (27); L0 = 16."""
    gap = LayerGap(
        layer=0,
        steps=99,
        beta=[[1.0, 0.5, math.sin(1.0)]],
        baseline=[math.sin(1.0)] * 3,
        mean_step=[[0.25, 0.0, -0.75]],
    )
    return Diagnosis(scheme="s", describe="d", train_length=16, w=16, windows_per_length=1, spectral_gap=[gap])


def test_the_study_adds_its_window_columns_to_diagnose_and_the_library_alone_does_not(accumulated_claims):
    """w_eps per block from the measured beta: median 27, one block of three mixes within L0 = 16, and the blocks
    that do not (beta 1, sin 1) have mean steps 0.25 and -0.75 (median abs 0.5)."""
    md = diagnose_markdown(_diagnosis())
    assert "(|sin a_b / a_b|; RoPE 1); w_eps = ceil(log eps / log beta), eps = 0.01." in md
    assert "| w_eps median | blocks with w_eps <= train length | others: median abs(mean step) (rad/token) |" in md
    assert "| 0 | 0.5000 / 0.8415 / 1.0000 | 0.8415 / 0.8415 / 0.8415 | 0.3415 | 27 | 1/3 | 5.00e-01 |" in md
    claims.unregister_claims(accumulated_claims.name)
    md = diagnose_markdown(_diagnosis())
    assert "w_eps" not in md and "(|sin a_b / a_b|; RoPE 1).\n" in md
    assert "| 0 | 0.5000 / 0.8415 / 1.0000 | 0.8415 / 0.8415 / 0.8415 | 0.3415 |\n" in md
