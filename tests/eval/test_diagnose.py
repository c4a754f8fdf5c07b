"""Attention diagnostics: streaming reductions equal the full matrix; closed forms; spectral gaps; CLI."""

import math

import numpy as np
import pytest
import torch

from posenc import build_model, encodings
from posenc.attention import attention, rotate
from posenc.cli.main import main
from posenc.encodings.accumulated import spectral_gap
from posenc.encodings.base import Dims, Encoding, Inputs
from posenc.eval.diagnose import (
    FarMassConfig,
    block_logits,
    diagnose_model,
    far_mass_records,
    layer_sums,
    naive_layer_sums,
    rotated_qk,
    step_phasor_sums,
    uniform_reference,
)
from posenc.model import LM
from posenc.reports.diagnose import markdown
from posenc.store.records import DIAGNOSE, Diagnosis, FarMass, load


def tiny(encoding, **kw) -> LM:
    cfg = {"n_layer": 2, "n_head": 2, "d_model": 32, "train_length": 16, "encoding": encoding, **kw}
    return build_model(cfg).eval()


def captures(model, T=64, B=2, seed=0):
    tokens = torch.randint(0, 256, (B, T), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return list(model.prepare(tokens))


@pytest.mark.parametrize("gain", [1, 40])  # near-uniform attention (a non-trivial bound), peaked attention
@pytest.mark.parametrize("scheme", ["rope", "alibi", "acc-rand-qkv"])
def test_streaming_equals_full_softmax_matrix(scheme, gain):
    model = tiny(scheme)
    with torch.no_grad():
        for b in model.blocks:
            b.attn.qkv.weight.mul_(gain)
    w, T, B, H = 16, 64, 2, 2
    for a in captures(model, T, B):
        q, k = rotated_qk(a)
        P = torch.softmax(block_logits(a, q, k, 0, T), dim=-1)  # (B, H, T, T): the full matrix
        # the probabilities are the attention the model computes (SDPA / chunked core)
        v = rotate(a.v, a.phases, a.pairing) if a.rotate_v else a.v
        out = P @ v
        out = rotate(out, -a.phases, a.pairing) if a.rotate_v else out
        ref = attention(
            a.q,
            a.k,
            a.v,
            phases=a.phases,
            rotate_v=a.rotate_v,
            pairing=a.pairing,
            bias=a.bias,
            logit_scale=a.logit_scale,
            block_size=16,
        )
        torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
        # independent reductions of the full matrix; the logit range of row i is log(max p / min p)
        Pn = P.double().numpy()
        far_i = np.stack([Pn[:, :, i, : i - w + 1].sum(-1) for i in range(w, T)], -1)  # (B, H, T - w)
        with np.errstate(divide="ignore"):  # min p underflows to 0 in peaked rows: r = inf, bound 0
            r_i = np.stack(
                [np.log(Pn[:, :, i, : i + 1].max(-1) / Pn[:, :, i, : i + 1].min(-1)) for i in range(w, T)], -1
            )
        M = np.arange(w, T) - w + 1
        bound_i = M / (M + w * np.exp(r_i))
        assert (far_i >= bound_i - 1e-6).all()  # the theorem holds query by query
        far, bound = far_i.sum((0, 2)), bound_i.sum((0, 2))
        ent = -(Pn * np.log(np.where(Pn > 0, Pn, 1))).sum((0, 2, 3))
        got = layer_sums(a, w, block_elems=B * H * T * 16)  # 4 query blocks of 16
        ref_sums = naive_layer_sums(a, w)
        for key, want in (("far", far), ("entropy", ent), ("bound", bound)):
            np.testing.assert_allclose(got[key].numpy(), want, rtol=1e-4, atol=1e-12)
            np.testing.assert_allclose(got[key].numpy(), ref_sums[key].numpy(), rtol=1e-6, atol=1e-12)
        if gain == 1 and scheme != "alibi":
            assert bound.min() > 0.2 * far.min() > 0
        if gain == 40:
            assert far.min() > 1.0 and (ent / (B * T)).max() < uniform_reference(T, w)[1] - 0.3  # not uniform attention


def test_nope_with_zero_qk_is_uniform_attention():
    model = tiny("nope")
    with torch.no_grad():
        for b in model.blocks:
            b.attn.qkv.weight[: 2 * 32].zero_()  # q = k = 0
    docs = [("x", np.random.default_rng(0).integers(0, 256, 2000).astype(np.uint16))]
    res = diagnose_model(model, docs, multiples=[1, 2, 8], n_windows=2, progress=False)
    for r in res.lengths:
        L = r.length
        i = np.arange(L)
        assert r.uniform_entropy == pytest.approx(np.log(i + 1).mean(), rel=1e-12)
        np.testing.assert_allclose(r.entropy, r.uniform_entropy, rtol=1e-6)
        if L == 16:  # no key at distance >= w = 16 inside a 16-token window
            assert r.far_mass is None and r.uniform_far_mass is None
            continue
        closed = np.mean([(t - 16 + 1) / (t + 1) for t in range(16, L)])
        assert r.uniform_far_mass == pytest.approx(closed, rel=1e-12)
        np.testing.assert_allclose(r.far_mass, closed, rtol=1e-6)


@pytest.mark.parametrize("slope", [0.3, 1.0, 20.0])
def test_alibi_far_mass_closed_form(slope):
    """Zero q/k: p_ij proportional to exp(-m (i-j));
    far mass of query i = sum_{d=w}^{i} e^{-md} / sum_{d=0}^{i} e^{-md}."""
    model = tiny("alibi")
    with torch.no_grad():
        for b in model.blocks:
            b.attn.qkv.weight[: 2 * 32].zero_()
            b.attn.enc.slopes.fill_(slope)
    w, T = 4, 48
    a = captures(model, T, B=1)[0]
    far = layer_sums(a, w, block_elems=2 * T * 8)["far"].numpy() / (T - w)
    e = np.exp(-slope * np.arange(T, dtype=np.float64))
    closed = np.mean([e[w : i + 1].sum() / e[: i + 1].sum() for i in range(w, T)])
    np.testing.assert_allclose(far, closed, rtol=1e-4, atol=1e-30)
    if slope == 20.0:
        assert far.max() < 1e-30


@pytest.mark.parametrize("center,a", [("zero", 1.0), ("zero", 2.5), ("rope", None)])
def test_spectral_gap_of_random_steps_matches_sin_a_over_a(center, a):
    dims = Dims(n_head=2, head_dim=16, d_model=32, vocab_size=256, train_length=16)
    params = {"center": center} | ({"a": a} if a else {})
    enc = encodings.get("acc-rand-qk", dims, **params).eval()
    T = 8192
    inp = Inputs(torch.zeros(1, T, 32), torch.arange(T), torch.zeros(1, T, dtype=torch.int64))
    z, n = step_phasor_sums(enc.phases(inp), n_head=2)
    beta = (z.abs() / n).numpy()
    expected = spectral_gap(enc.width_b).numpy()  # |sin a_b / a_b|
    if center == "zero":
        assert expected == pytest.approx(abs(math.sin(a) / a))
    assert n == T - 1 and beta.shape == (2, 8)
    np.testing.assert_allclose(beta, np.broadcast_to(expected, beta.shape), atol=5 / math.sqrt(n))


def test_learned_steps_at_init_are_constant_and_rope_steps_by_its_frequencies():
    docs = [("x", np.random.default_rng(1).integers(0, 256, 600).astype(np.uint16))]
    for scheme in ("acc-learned-qkv", "rope"):
        res = diagnose_model(tiny(scheme), docs, multiples=[1, 4], n_windows=1, progress=False)
        assert len(res.spectral_gap) == 2
        for g in res.spectral_gap:
            np.testing.assert_allclose(g.beta, 1.0, atol=1e-9)  # zero-initialised step map: theta = 0
            drift = np.asarray(g.mean_step)  # RoPE rotates by omega_b every token; learned steps start at 0
            want = 10000.0 ** (-np.arange(0, 16, 2) / 16) if scheme == "rope" else np.zeros(8)
            np.testing.assert_allclose(drift, np.broadcast_to(want, drift.shape), atol=1e-6)
        base = np.asarray(res.spectral_gap[0].baseline)
        if scheme == "rope":
            assert (base == 1).all()
        else:  # the uniform law on the bound [-1, 1]: |sin 1 / 1| on every block
            np.testing.assert_allclose(base, math.sin(1.0), rtol=1e-6)


class _CustomAttend(Encoding):
    name = "test-diagnose-attend"
    replaces_attention = True

    def attend(self, q, k, v, inp, bias=None):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_custom_attend_is_reported_not_supported():
    encodings.register(_CustomAttend)
    try:
        docs = [("x", np.zeros(200, dtype=np.uint16))]
        res = diagnose_model(tiny(_CustomAttend.name), docs, multiples=[1, 2], progress=False)
    finally:
        encodings.unregister(_CustomAttend.name)
    assert res.note.startswith("not supported") and res.lengths == []


def test_far_mass_records_are_the_diagnosis_means():
    """compare's cheap pass: one FarMass per length, the means of diagnose_model's LengthDiagnosis and its w."""
    docs = [("x", np.random.default_rng(2).integers(0, 256, 2000).astype(np.uint16))]
    base = {"scheme": "rope", "seed": 3, "train_length": 16}
    torch.manual_seed(0)
    model = tiny("rope")
    recs = far_mass_records(model, docs, FarMassConfig(multiples=[1, 4], windows=1), base)
    full = diagnose_model(model, docs, multiples=[1, 4], n_windows=1, progress=False)
    assert (
        all(isinstance(r, FarMass) for r in recs)
        and [(r.scheme, r.seed, r.train_length, r.w) for r in recs] == [("rope", 3, 16, 16)] * 2
    )
    assert [
        (r.length, r.windows, r.far_mass_mean, r.entropy_mean, r.uniform_far_mass, r.uniform_entropy) for r in recs
    ] == [
        (d.length, d.windows, d.far_mass_mean, d.entropy_mean, d.uniform_far_mass, d.uniform_entropy)
        for d in full.lengths
    ]
    assert recs[0].far_mass_mean is None and 0 < recs[1].far_mass_mean < 1
    assert recs[1].uniform_far_mass == pytest.approx(np.mean([(t - 15) / (t + 1) for t in range(16, 64)]), rel=1e-12)
    assert far_mass_records(model, docs, FarMassConfig(multiples=[1], windows=0), base) == []


def test_far_mass_records_of_an_unreadable_scheme_are_notes():
    encodings.register(_CustomAttend)
    try:
        recs = far_mass_records(
            tiny(_CustomAttend.name),
            [("x", np.zeros(200, dtype=np.uint16))],
            FarMassConfig(multiples=[1, 2]),
            {"scheme": _CustomAttend.name, "seed": 0, "train_length": 16},
        )
    finally:
        encodings.unregister(_CustomAttend.name)
    assert [r.length for r in recs] == [16, 32] and all(
        r.note.startswith("not supported") and r.w is None for r in recs
    )


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("diag") / "acc"
    assert main(["train", "--scheme", "acc-rand-qkv", "--preset", "quick", "--steps", "5", "--out", str(run)]) == 0
    return run


def test_diagnose_cli_writes_table_and_plots(trained_run, capsys):
    assert main(["diagnose", str(trained_run), "--multiples", "1", "2", "8", "--windows", "1"]) == 0
    out = trained_run / "diagnose"
    for name in ("diagnose.md", "diagnose.jsonl", "far_mass.png", "entropy.png", "spectral_gap.png"):
        assert (out / name).stat().st_size > 0, name
    [res] = load(out / "diagnose.jsonl", DIAGNOSE)  # the records file, read back through the store
    assert isinstance(res, Diagnosis) and [r.length for r in res.lengths] == [32, 64, 256]
    assert res.lengths[0].far_mass is None and len(res.lengths[2].far_mass) == 2  # layers
    assert 0 < res.lengths[2].far_mass_mean < 1 and len(res.spectral_gap) == 2
    md = (out / "diagnose.md").read_text()
    assert "| 1.1 | n/a |" in md and "## Spectral gap of the step angles" in md
    assert markdown(res) == md  # the report of the record read back is the one written
    out, err = capsys.readouterr()
    assert "far attention mass" in out.lower() and "\r" not in err  # not a terminal: no progress bar


def test_diagnose_without_checkpoint_exits_2(tmp_path, capsys):
    assert main(["diagnose", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("posenc: error: ") and "has no checkpoint" in err


@pytest.mark.parametrize("window", ["256", "100000"])
def test_diagnose_window_beyond_every_length_exits_2(trained_run, capsys, window):
    """w >= the longest evaluation length leaves no query with far keys: every far mass would be n/a."""
    assert (
        main(
            ["diagnose", str(trained_run), "--multiples", "1", "8", "--window", window, "--out", str(trained_run / "w")]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"far-mass distance w={window} must be < the longest evaluation length 256" in err
    assert not (trained_run / "w").exists()


@pytest.mark.parametrize("scheme", ["cope", "dape", "cope+alibi"])
def test_attending_schemes_are_read_through_their_logits(scheme):
    """diagnose reads exactly the softmax the model attends with: its logits give the layer's output."""
    torch.manual_seed(0)
    model, w = tiny(scheme), 16
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "pos_emb" in name:  # CoPE's position embeddings start at 0
                torch.nn.init.normal_(param, std=0.5)
        tokens = torch.randint(0, 256, (2, 48))
        for layer, a in enumerate(model.prepare(tokens)):
            enc, T = model.blocks[layer].attn.enc, a.q.shape[-2]
            p = torch.softmax(enc.logits(a.q, a.k, a.inp, a.bias, 0, T), dim=-1)
            torch.testing.assert_close(p @ a.v, enc.attend(a.q, a.k, a.v, a.inp), atol=1e-6, rtol=1e-5)
            i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
            far = (p * (i - j >= w)).sum(-1)[..., w:].double().sum((0, 2))
            torch.testing.assert_close(
                layer_sums(a, w, block_elems=2 * 2 * 48 * 8, enc=enc)["far"], far, atol=1e-9, rtol=1e-6
            )
    res = diagnose_model(model, [("x", np.arange(300, dtype=np.uint16) % 256)], multiples=[1, 2], progress=False)
    assert res.note is None and res.lengths[1].far_mass_mean > 0
