"""experiments.accumulated.theory: closed forms and bounds against float64 Monte Carlo, bad input, the CLI."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from experiments.accumulated.theory import (
    decay,
    far_mass,
    long_range_decay,
    mixing_check,
    parse_dist,
    plots,
    score_gap,
    translation_invariance,
    value_incoherence,
    window_size,
    window_vs_context,
)
from experiments.accumulated.theory.cli import PROG, theory
from experiments.accumulated.theory.mass import (
    _geometric_form,
    alibi_bounds,
    far_mass_bound,
    forget_gate_bound,
    gate_mean,
)
from experiments.accumulated.theory.run import Check, Row, load_budget, run_check
from experiments.accumulated.theory.scores import tail_bound
from experiments.accumulated.theory.stats import bernstein_tol, compare
from experiments.accumulated.theory.steps import SO2Uniform, unit_vectors
from posenc.attention import rotate
from posenc.cli.main import main
from posenc.encodings.absolute import sinusoidal_table
from posenc.encodings.polar import pope_freqs
from posenc.encodings.xpos import xpos_zeta
from posenc.errors import PosencError


@pytest.fixture(autouse=True)
def one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)  # small tensors; the cores are shared
    yield
    torch.set_num_threads(old)


# ---- the one check helper: compare a simulation with its bound, a check's rows


def test_compare_sides_tolerances_and_nan():
    assert compare([1.0, 2.0], [1.1, 1.9], 0.1 + 1e-12) and not compare([1.0, 2.0], [1.1, 1.9], 0.09)
    assert compare(torch.tensor([0.5, 0.7]), 0.65, 0.05, "upper") and not compare(0.71, 0.65, 0.05, "upper")
    assert compare(np.array([0.5, 0.7]), 0.55, 0.05, "lower") and not compare(0.49, 0.55, 0.05, "lower")
    assert compare(0.0, 5.0, side="upper") and not compare(0.0, 5.0, side="lower")  # tol 0: the bound itself
    assert compare([[1.0, 3.0]], [1.0, 3.0], [0.0, 0.0]) and not compare([[1.0, 3.0]], [1.0, 3.5], [0.0, 0.4])
    assert not compare(math.nan, 0.0, math.inf) and not compare([0.0, math.nan], 0.0, 1.0, "upper")
    with pytest.raises(PosencError, match="side must be one of both, upper, lower, got 'two-sided'"):
        compare(1.0, 1.0, side="two-sided")


def test_run_check_stores_the_result_and_returns_its_rows():
    results = {"mixing": {}, "skipped": {}}
    named = Check("mixing", "so2:1", lambda: {"holds": True, "x": 2}, lambda r: [Row("1 a", "x = 2", f"x {r['x']}", 1)])
    rows = run_check(named, results)
    assert rows == [{"check": "1 a", "prediction": "x = 2", "simulation": "x 2", "holds": True}]
    assert type(rows[0]["holds"]) is bool and results["mixing"] == {"so2:1": {"holds": True, "x": 2}}
    two = Check("decay", None, lambda: {"holds": False}, lambda r: [Row("5 a", "p", "s", r["holds"])] * 2)
    assert [r["holds"] for r in run_check(two, results)] == [False, False] and results["decay"] == {"holds": False}

    def no_far_regime():
        raise PosencError("window 10^7 > 2048 steps")

    assert run_check(Check("score_gap", "so2-drift", no_far_regime, lambda r: []), results) == []
    assert results["skipped"] == {"score_gap so2-drift": "window 10^7 > 2048 steps"}


# ---- check 1: mixing window


@pytest.mark.parametrize(
    ("beta", "eps", "window"),
    [(0.5, 0.01, 7), (0.5, 0.125, 3), (0.9, 0.5, 7), (math.sin(1.0), 0.01, 27), (0.0, 0.01, 1), (0.999, 0.9, 106)],
)
def test_window_size_known_beta(beta, eps, window):
    assert window_size(beta, eps) == window
    if beta > 0:  # it is the first n with beta^n <= eps
        assert beta**window <= eps * (1 + 1e-12) and (window == 1 or beta ** (window - 1) > eps)


def test_window_size_without_gap_is_infinite():
    assert window_size(1.0, 0.01) == math.inf


def test_so2_uniform_mixing_matches_sin_a_over_a():
    r = mixing_check("so2:1", d=8, samples=4000, n_max=40, seed=1)
    assert r["beta"] == pytest.approx(math.sin(1.0) / 1.0, abs=1e-15)
    assert r["window"] == 27
    err = np.abs(np.array(r["norm_sim"]) - math.sin(1.0) ** np.arange(41))
    assert err.max() == pytest.approx(r["max_error"]) and err.max() <= r["tolerance"]
    # the tolerance is a few standard errors: sqrt(2 log(2d/delta)/N) to first order
    assert r["tolerance"] == pytest.approx(bernstein_tol(4000, 8, 1e-3 / 41))
    assert 0.02 < r["tolerance"] < 0.1
    assert r["holds"] and r["blocks"]["holds"]


def test_mixing_window_names_only_a_schemes_window():
    """The Monte Carlo check is mixing_check (a dict of the check); mixing_window is the model's w_eps (tokens, the
    study's report quantity: experiments/accumulated/window.py)."""
    import experiments.accumulated.theory as pkg
    from experiments.accumulated.window import mixing_window
    from posenc.model import ModelConfig

    assert not hasattr(pkg, "mixing_window") and not hasattr(pkg.mixing, "mixing_window")
    mcfg = ModelConfig(n_layer=1, n_head=2, d_model=32, train_length=16, encoding="acc-rand-qk")
    assert (
        mixing_window(mcfg, 0.01) == mixing_check("so2:1", d=8, samples=10, n_max=2)["window"] == 27
    )  # a = 1: |sin 1| both


def test_wrong_closed_form_is_rejected(monkeypatch):
    def wrong(self):  # 10% below |sin a / a|
        return torch.full((self.d // 2,), 0.9 * math.sin(self.a) / self.a, dtype=torch.complex128)

    monkeypatch.setattr(SO2Uniform, "block_means", wrong)
    assert not mixing_check("so2:1", d=8, samples=4000, n_max=40, seed=1)["holds"]


def test_drift_blocks_have_rope_frequency_gaps():
    r = mixing_check("so2-drift", d=8, samples=4000, n_max=30, seed=2)
    omega = 10000.0 ** (-2 * np.arange(4) / 8)
    np.testing.assert_allclose(r["blocks"]["beta"], np.sin(omega) / omega, rtol=1e-14)
    assert r["blocks"]["window"][0] == 27  # omega_0 = 1 mixes like so2:1
    assert r["blocks"]["window"][-1] > 10**6  # the slowest block keeps RoPE's long-range signal
    assert r["holds"]


def test_householder_and_haar_gaps():
    h = mixing_check("householder", d=8, samples=1500, n_max=30, seed=3)
    assert h["beta"] == pytest.approx(1 - 1 / 8) and h["window"] == 35
    assert h["max_error"] <= h["tolerance"]
    g = mixing_check("haar", d=8, samples=1500, n_max=3, seed=4)
    assert g["beta"] == 0 and g["window"] == 1
    assert max(g["norm_sim"][1:]) <= g["tolerance"]  # E[U] = 0: only noise is left


def test_window_does_not_depend_on_context_length():
    r = window_vs_context("so2:1", d=16, lengths=(128, 1024), samples=800, seed=5)
    assert r["window"] == 27
    for c in r["contexts"]:
        assert abs(c["window_sim"] - 27) <= c["tolerance"] < 6
        assert c["beta_sim"] == pytest.approx(math.sin(1.0), abs=0.02)
    assert r["holds"]


# ---- check 2: score gap


def test_score_gap_bounds_hold_and_far_scores_concentrate():
    r = score_gap("so2:1", dims=(8, 32, 128), samples=2000, seed=6)
    assert r["holds"]
    for p in r["per_dim"]:
        assert all(s <= b + r["tail_tolerance"] for s, b in zip(p["tail_sim"], p["tail_bound"]))
        assert p["near_mean"] == pytest.approx(math.sin(1.0), abs=r["z"] * p["near_se"])
        assert abs(p["far_mean"] - p["far_pred"]) <= r["z"] * p["far_se"]
    stds = [p["far_std"] for p in r["per_dim"]]
    assert stds[0] > stds[1] > stds[2]
    # mixed phases: Var s = sum_b |q_b|^4 / 2, whose mean over random unit q is 2/(d+2)
    assert stds[2] == pytest.approx(math.sqrt(2 / 130), rel=0.25)


def test_haar_levy_bound_and_far_tails():
    r = score_gap("haar", dims=(16, 64), samples=4000, seed=7)
    t = torch.tensor(r["thresholds"], dtype=torch.float64)
    for p in r["per_dim"]:
        np.testing.assert_allclose(p["tail_bound"], np.minimum(1, 2 * np.exp(-p["d"] * t.numpy() ** 2 / 2)))
    assert r["per_dim"][0]["near_mean"] == pytest.approx(1.0)  # n = 0: P_0 = I
    assert r["holds"]


def test_householder_second_moment_matches_simulation():
    steps = parse_dist("householder", 8)
    gen = torch.Generator().manual_seed(8)
    q = unit_vectors(1, 8, gen)[0]
    k = unit_vectors(1, 8, gen)[0]
    s = steps.apply(k.expand(20000, -1).clone(), 12, gen) @ q
    second = s.square()
    se = float(second.std()) / math.sqrt(20000)
    assert steps.second_moment(q, k, 12) == pytest.approx(float(second.mean()), abs=4 * se)
    bound = tail_bound(steps, q, k, 12, torch.tensor([0.3, 0.6], dtype=torch.float64))
    assert (torch.tensor([(s.abs() > 0.3).double().mean(), (s.abs() > 0.6).double().mean()]) <= bound).all()


# ---- check 3: far mass


def test_far_mass_bound_holds_and_tends_to_one():
    r = far_mass(K=8, lam=2.0, Ms=(8, 64, 512, 4096), d=8, samples=16, seed=9)
    assert r["checks"] == {"bound": True, "tight": True, "alibi": True, "forget_gate": True}
    lower = np.array(r["lower_bound"])
    np.testing.assert_allclose(lower, np.array([8, 64, 512, 4096]) / (np.array([8, 64, 512, 4096]) + 8 * math.e**4))
    assert (np.array(r["rho_min"]["none"]) >= lower - 1e-12).all()
    assert r["rho_mean"]["none"][-1] > 0.99 and lower[-1] > 0.9
    # explicit far-mass control: bounded away from 1 for every M, and flat in M
    assert max(r["rho_max"]["alibi"]) <= r["alibi_sup"] < 0.95
    assert abs(r["rho_mean"]["alibi"][-1] - r["rho_mean"]["alibi"][1]) < 0.01
    assert r["rho_mean"]["forget_gate"][-1] <= r["forget_gate_sup"] < 0.95


def test_far_mass_closed_forms():
    assert far_mass_bound(100, 10, 0.0) == pytest.approx(100 / 110)
    lo, hi = alibi_bounds([1e6], 10, 1.0, 1e-9)  # slope -> 0 recovers the unbiased bounds
    assert lo[0] == pytest.approx(far_mass_bound(1e6, 10, 1.0), rel=1e-3)
    assert hi[0] == pytest.approx(1e6 / (1e6 + 10 * math.exp(-2.0)), rel=1e-3)
    assert gate_mean(0.0, 1.0) == pytest.approx(0.5, abs=1e-12)
    z = torch.randn(400000, generator=torch.Generator().manual_seed(10), dtype=torch.float64) + 1.0
    assert gate_mean(1.0, 1.0) == pytest.approx(float(torch.sigmoid(z).mean()), abs=2e-3)
    assert forget_gate_bound(math.inf, 8, 2.0, 0.5) == pytest.approx(1 / (1 + math.exp(-4) * 0.5 / 0.5**8))


# ---- check 4: value-side incoherence


def test_geometric_form_matches_brute_force():
    x = torch.rand(3, 40, generator=torch.Generator().manual_seed(11), dtype=torch.float64)
    lags = (torch.arange(40)[:, None] - torch.arange(40)[None]).abs().double()
    for beta in (0.0, 0.3, 0.9):
        np.testing.assert_allclose(_geometric_form(x, beta), ((x @ beta**lags) * x).sum(1), rtol=1e-12)


def test_value_incoherence_coherent_vs_incoherent():
    r = value_incoherence(K=4, Ms=(16, 256, 2048), d=8, samples=128, seed=12)
    assert r["holds"]
    rows = r["per_M"]
    for row in rows:
        assert row["coherent"] == pytest.approx(row["rho_sq"] + row["sum_sq_weights"], rel=1e-12)
        assert abs(row["incoherent_trace"] - row["incoherent_pred"]) <= r["z"] * row["incoherent_se"]
    # coherent stays ~ rho_D^2 -> 1; incoherent falls with the squared weights
    assert rows[-1]["coherent"] > 0.95 and rows[-1]["incoherent"] < 0.05
    assert rows[-1]["coherent"] / rows[-1]["incoherent"] > 10 * rows[0]["coherent"] / rows[0]["incoherent"]
    # ignoring the beta^|j-l| cross terms (pure sum of squares) would be rejected
    assert rows[-1]["incoherent_trace"] - 2 * rows[-1]["sum_sq_weights"] > 10 * rows[-1]["incoherent_se"]


def test_conditional_covariance_formula_by_simulating_values():
    """Cov(sum a_j R(psi_j)(g + n_j)) = sigma_g^2 B B^T + sigma_n^2 sum a^2 I, B = sum a_j R(psi_j)."""
    gen = torch.Generator().manual_seed(13)
    d, m, draws = 4, 24, 40000
    a = torch.rand(m, generator=gen, dtype=torch.float64)
    a /= a.sum()
    psi = 2 * torch.rand(m, d // 2, generator=gen, dtype=torch.float64)
    g = torch.randn(draws, 1, d, generator=gen, dtype=torch.float64)
    noise = torch.randn(draws, m, d, generator=gen, dtype=torch.float64)
    e = (a[None, :, None] * rotate(g + noise, psi.expand(draws, m, -1), "adjacent")).sum(1)
    z = (a[:, None] * torch.polar(torch.ones_like(psi), psi)).sum(0)
    predicted = torch.diag((z.abs().square() + a.square().sum()).repeat_interleave(2))
    np.testing.assert_allclose(torch.cov(e.T), predicted, atol=6 * float(predicted.max()) / math.sqrt(draws))


# ---- check 5: decay and translation invariance


def test_encoding_tables():
    d = 8
    np.testing.assert_allclose(sinusoidal_table(torch.tensor([0.0]), d)[0], [0, 1] * (d // 2))
    np.testing.assert_allclose(xpos_zeta(d), (2 * np.arange(4) + 0.4 * d) / (1.4 * d))
    theta = pope_freqs(d)
    assert theta[0] == 1 and (theta[1:] < 1).all() and float(theta[-1]) == pytest.approx(10000 ** (-(d - 1) / d))


def test_long_range_decay_closed_forms_match_simulation():
    r = long_range_decay(d=32, max_dist=512, samples=400, seed=14)
    assert r["holds"]
    for name, s in r["schemes"].items():
        if "holds" in s:
            assert s["max_z_error"] <= r["z"], name
    rope = r["schemes"]["rope-10000"]
    assert rope["curve"][0] == 1
    assert rope["at"]["1"] == pytest.approx(np.cos(10000.0 ** (-2 * np.arange(16) / 32)).mean())
    assert r["schemes"]["alibi"]["at"]["256"] == pytest.approx(1 - 256 / 16)
    # a larger base decays slower
    assert r["schemes"]["rope-500000"]["at"]["256"] > r["schemes"]["rope-10000"]["at"]["256"]
    assert abs(r["schemes"]["pope-survey-sign"]["at"]["1"]) < 0.2  # no locality with the survey's sign


def test_translation_invariance():
    r = translation_invariance(d=16, samples=64, shifts=(1, 1000, 100000), seed=15)
    s = r["schemes"]
    for name in ("rope-10000", "rope-500000", "xpos", "pope", "alibi", "accumulated-token"):
        assert s[name]["rel_change"] <= 1e-9, name
    for name in ("sinusoidal", "accumulated-iid"):
        assert s[name]["rel_change"] > 1e-2, name
    assert r["holds"]


# ---- bad input and the CLI


@pytest.mark.parametrize(
    ("spec", "d"),
    [
        ("foo", 8),
        ("so2:0", 8),
        ("so2:-1", 8),
        ("so2:abc", 8),
        ("so2:nan", 8),
        ("so2:1", 7),
        ("so2-drift", 5),
        ("householder:2", 8),
        ("so2-drift:1", 8),
        ("haar", 1),
    ],
)
def test_bad_distribution_raises(spec, d):
    with pytest.raises(PosencError):
        parse_dist(spec, d)


@pytest.mark.parametrize("eps", [0.0, 1.0, 1.5, -0.1])
def test_bad_eps_raises(eps):
    with pytest.raises(PosencError):
        window_size(0.5, eps)
    with pytest.raises(PosencError):
        mixing_check("so2:1", d=8, eps=eps, samples=10, n_max=2)


def test_theory_is_the_studys_command_not_the_librarys(capsys):
    """The library's command line has no theory (issue 61: the study left the library); the study's script adds it
    with posenc's option handling (``posenc.cli.main.main``'s ``commands``): --help names the script, an unknown
    option is one line, exit 2."""
    for run, argv in ((main, ["theory", "--quick"]), (theory, ["--quick", "--bogus"]), (theory, ["--help"])):
        with pytest.raises(SystemExit) as exit_:
            run(argv)
        assert exit_.value.code == (0 if argv == ["--help"] else 2)
    out, err = capsys.readouterr()
    assert out.startswith("usage: python -m experiments.accumulated.theory [-h]")
    assert err.splitlines()[0].startswith("posenc: error: argument command: invalid choice: 'theory'")
    assert err.splitlines()[1:] == [f"{PROG}: error: unrecognized arguments: --bogus"]  # its own name, not posenc's


def test_an_out_that_is_a_file_is_refused_before_any_check_runs(tmp_path, capsys, monkeypatch):
    """--out naming a file: one line, exit 2, no check run and the file untouched (it raised FileExistsError after
    computing every check)."""
    f = tmp_path / "config.json"
    f.write_text("{}")
    monkeypatch.setattr("experiments.accumulated.theory.run.run_check", lambda *a: pytest.fail("a check ran"))
    assert theory(["--quick", "--out", str(f)]) == 2
    assert capsys.readouterr().err == f"{PROG}: error: --out {f} is a file; give a folder (new or existing)\n"
    assert f.read_text() == "{}"


@pytest.mark.slow
def test_the_study_runs_its_command_as_a_module(tmp_path):
    """``python -m experiments.accumulated.theory`` from the repository root: bad input is one line, exit 2."""
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.accumulated.theory", "--eps", "0", "--out", str(tmp_path / "x")],
        cwd=root,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("python -m experiments.accumulated.theory: error: ") and "eps" in proc.stderr


@pytest.mark.parametrize(
    "extra",
    [["--eps", "0"], ["--eps", "1.2"], ["--dists", "so3"], ["--dists", "so2:0"], ["--dims", "7"], ["--mix-dim", "9"]],
)
def test_cli_bad_input_is_one_line_exit_2(tmp_path, capsys, extra):
    assert theory(["--quick", "--out", str(tmp_path / "x"), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{PROG}: error: ") and err.count("\n") == 1  # the study's program, not posenc
    assert not (tmp_path / "x").exists()  # validated before any work


@pytest.mark.slow
def test_cli_quick_writes_summary_results_and_plots(tmp_path, capsys):
    out = tmp_path / "theory"
    assert theory(["--quick", "--out", str(out), "--dims", "8", "16", "--seed", "3"]) == 0
    printed = capsys.readouterr().out
    assert "| check | prediction (bound / closed form) | simulation | holds |" in printed
    summary = (out / "summary.md").read_text()
    assert "| 1 mixing so2:1 (d=16, eps=0.01) |" in summary and "**no**" not in summary
    report = json.loads((out / "results.json").read_text())
    assert report["all_hold"] and report["config"]["dims"] == [8, 16]
    assert {r["check"].split()[0] for r in report["table"]} == {"1", "2", "3", "4", "5"}
    assert report["results"]["mixing"]["so2-drift"]["blocks"]["window"][0] == 27
    assert "score_gap so2-drift" in report["results"]["skipped"]  # no far regime within reach
    for name in ("mixing", "window_context", "score_gap", "far_mass", "value_incoherence", "decay"):
        assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.glob(".*tmp"))  # atomic writes leave no temp files


def test_budgets_are_shipped_presets(tmp_path):

    full, quick = load_budget("full"), load_budget("quick")
    assert (
        full.mix_samples == 20000 and full.mass_Ms == tuple(2**i for i in range(4, 17)) and full.decay_max_dist == 8192
    )
    assert (
        quick.mix_samples == 2000
        and quick.context_lengths == (256, 1024)
        and quick.value_Ms == tuple(2**i for i in range(4, 11))
    )
    bad = tmp_path / "b.yaml"
    bad.write_text(quick.model_dump_json().replace("mix_samples", "mix_sample"))
    with pytest.raises(PosencError, match="invalid theory budget b.yaml: mix_sample"):
        load_budget(str(bad))
    with pytest.raises(PosencError, match="unknown theory budget 'nosuch'; valid: full, quick"):
        load_budget("nosuch")


def test_theory_takes_a_budget_preset_and_set_from_the_command_line(tmp_path, capsys):

    out = tmp_path / "t"
    assert theory(["--quick", "--set", "mix_samples=500", "--dists", "so2:1", "--dims", "8", "--out", str(out)]) == 0
    budget = json.loads((out / "results.json").read_text())["config"]["budget"]
    assert budget["mix_samples"] == 500 and budget["gap_samples"] == load_budget("quick").gap_samples
    capsys.readouterr()
    assert theory(["--preset", "full", "--set", "mix_samples=0", "--out", str(out)]) == 2
    assert (
        capsys.readouterr().err
        == f"{PROG}: error: invalid mix_samples=0 (command line): Input should be greater than 0\n"
    )


# ---- the figures


def test_theory_log_axes_carry_plain_labels():
    """docs/plots.md: log axes carry plain labels (render.log_scale); the theory command's plots wrote 10^k ones."""
    fig = plots._decay(decay.long_range_decay(max_dist=64, samples=8, seed=5))
    fig.canvas.draw()
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert {"1", "10"} <= set(labels) and not any("^" in t or "$" in t for t in labels)
    assert [line.get_label() for line in fig.axes[0].get_lines()][:2] == ["sinusoidal", "rope-10000"]


def test_theory_mixing_keeps_equal_blocks_visible():
    """Slow blocks of so2-drift all sit at beta = 1: the last one drew over the others, unlabelled."""
    drift = {"dist": "so2-drift", "beta": 1.0, "eps": 0.01, "tolerance": 0.1, "norm_sim": [1.0] * 8}
    drift |= {"norm_pred": [1.0] * 8, "blocks": {"beta": [0.5, 0.9, 1.0, 1.0], "window": [7, 44, 10**6, 10**8]}}
    labels = [line.get_label() for line in plots._mixing({"so2-drift": drift}).axes[1].get_lines()]
    assert labels[2:] == [
        "block 2: beta=1, w=1000000",
        "block 3: beta=1, w=100000000 (same as block 2: beta=1, w=1000000)",
    ]
