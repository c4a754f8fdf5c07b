"""The Canon-A layer (``model.canon``): the fast convolution equals its loop reference (values and gradients), a
model with it decodes as its parallel forward, and a model without it is built as before."""

import dataclasses
import json

import pytest
import torch

from posenc.config.plan import load_preset, model_line
from posenc.errors import PosencError
from posenc.model import Cache, Canon, ModelConfig, build_model, canon_naive, set_method
from posenc.train.rundir import run_differences
from posenc.train.settings import TrainConfig


@pytest.mark.parametrize("width, T", [(1, 5), (3, 9), (4, 2)])
def test_canon_equals_its_reference_in_values_and_gradients(width, T):
    torch.manual_seed(0)
    canon = Canon(6, width).double()
    h = torch.randn(2, T, 6, dtype=torch.float64, requires_grad=True)
    fast, naive = canon(h), canon_naive(h, canon.conv.weight)
    assert torch.allclose(fast, naive, atol=1e-12)
    g = torch.randn_like(fast)
    fast_grads = torch.autograd.grad(fast, (h, canon.conv.weight), g)
    naive_grads = torch.autograd.grad(canon_naive(h, canon.conv.weight), (h, canon.conv.weight), g)
    for a, b in zip(fast_grads, naive_grads):
        assert torch.allclose(a, b, atol=1e-12)


def test_canon_is_causal_and_mixes_the_predecessors():
    canon = Canon(1, 3).double()
    with torch.no_grad():
        canon.conv.weight.copy_(torch.tensor([[[1.0, 10.0, 100.0]]]))  # taps on t-2, t-1, t
    h = torch.tensor([[[1.0], [2.0], [3.0], [4.0]]], dtype=torch.float64)
    assert canon(h)[0, :, 0].tolist() == [101.0, 212.0, 324.0, 436.0]  # h_t + 100 h_t + 10 h_{t-1} + h_{t-2}


def model(spec, canon=3, dtype=torch.float64):
    cfg = {"encoding": spec, "n_layer": 2, "n_head": 2, "d_model": 32, "train_length": 20, "canon": canon}
    return build_model(cfg).to(dtype).eval()


def test_every_attention_reads_the_canon_of_its_normalised_input(monkeypatch):
    torch.manual_seed(0)
    m, x = model("rope"), torch.randint(0, 256, (2, 10))
    seen = []
    for block in m.blocks:
        real = block.attn.prepare
        monkeypatch.setattr(block.attn, "prepare", lambda h, *a, real=real, **k: seen.append(h) or real(h, *a, **k))
    with torch.no_grad():
        h0 = m.blocks[0].norm1(m.tok(x))
        m(x)
    assert len(seen) == 2
    assert torch.allclose(seen[0], canon_naive(h0, m.blocks[0].canon.conv.weight), atol=1e-12)
    assert not torch.allclose(seen[0], h0, atol=1e-3)  # the taps are not zero: the layer changes the input


@pytest.mark.parametrize("spec", ["rope", "alibi", "nope", "path", "acc-rand-qkv", "learned"])
def test_a_model_with_canon_decodes_as_its_parallel_forward(spec):
    torch.manual_seed(0)
    m, x = model(spec), torch.randint(0, 256, (2, 20))
    cache, out, start = Cache(len(m.blocks)), [], 0
    with torch.no_grad():
        for end in (1, 7, *range(8, 21)):  # a one-token prefill (shorter than the width), a chunk, then single tokens
            out.append(m.decode(x[:, start:end], cache))
            start = end
        err = (torch.cat(out, dim=1) - m(x)).abs().max().item()
    assert err < 1e-10, err


def test_canon_changes_the_forward_and_generation_keeps_beams_apart():
    torch.manual_seed(0)
    m, x = model("rope"), torch.randint(0, 256, (3, 12))
    with torch.no_grad():
        cache = Cache(len(m.blocks))
        m.decode(x[:, :8], cache)
        cache.reorder(torch.tensor([2, 0]))
        logits = m.decode(x[[2, 0], 8:], cache)
        assert torch.allclose(logits, m(x[[2, 0]])[:, 8:], atol=1e-10)
        plain = model("rope", canon=0)
        plain.load_state_dict({k: v for k, v in m.state_dict().items() if "canon" not in k})
        assert (m(x) - plain(x)).abs().max() > 1e-3
        for block in m.blocks:
            block.canon.conv.weight.zero_()
        assert torch.allclose(m(x), plain(x), atol=1e-12)  # zero taps: the layer is the identity


def test_a_canon_cache_refuses_to_crop_and_counts_its_bytes():
    m, x = model("rope"), torch.randint(0, 256, (1, 6))
    cache = Cache(len(m.blocks))
    with torch.no_grad():
        m.decode(x, cache)
    assert cache.nbytes() >= 2 * 2 * 32 * 8  # two layers' two float64 rows of width 32
    cache.crop(6)  # to its own length: nothing lost
    with pytest.raises(PosencError, match="Canon layer cannot crop"):
        cache.crop(3)
    assert cache.length == 6


def test_without_canon_the_model_has_no_canon_parameters_and_the_same_initial_weights():
    torch.manual_seed(0)
    a = build_model({"encoding": "path", "n_layer": 2, "d_model": 32, "n_head": 2})
    torch.manual_seed(0)
    b = build_model({"encoding": "path", "n_layer": 2, "d_model": 32, "n_head": 2, "canon": 0})
    assert not [k for k in a.state_dict() if "canon" in k]
    assert all(torch.equal(a.state_dict()[k], v) for k, v in b.state_dict().items())


@pytest.mark.parametrize("bad", [-1, 2.5, "3", True, 129])
def test_a_bad_canon_width_is_refused_in_one_line(bad):
    with pytest.raises(PosencError, match=r"canon must be an integer in \[0, train_length 128\]"):
        build_model({"canon": bad})


@pytest.mark.parametrize("chunk", [1, 5])
def test_a_canon_model_streams_through_the_sinks_cache_as_its_parallel_forward(chunk):
    torch.manual_seed(0)
    m, text = model("rope"), torch.randint(0, 256, (30,))
    set_method(m, "sinks:n_sink=2,window=8")
    with torch.no_grad():
        streamed, peak = m.streaming_nll(text, chunk=chunk)
        parallel = m.token_nll(text[None, :-1], text[None, 1:])[0]
        _, peak_long = m.streaming_nll(torch.cat((text, text)), chunk=chunk)
    assert torch.allclose(streamed, parallel, atol=1e-10)
    assert peak_long == peak  # the Canon state stays width - 1 rows: the cache stays flat


def test_a_run_recorded_before_canon_resumes_as_canon_0(tmp_path):
    mcfg, tcfg = ModelConfig(), TrainConfig()
    saved = {k: v for k, v in dataclasses.asdict(mcfg).items() if k != "canon"}
    (tmp_path / "config.json").write_text(json.dumps({"model": saved, "train": tcfg.model_dump(mode="json")}))
    assert run_differences(tmp_path, mcfg, tcfg) == {}
    assert run_differences(tmp_path, dataclasses.replace(mcfg, canon=3), tcfg) == {"model": ["canon 0 -> 3"]}


def test_the_report_header_names_the_canon_layer():
    assert model_line(load_preset("retrieval")).endswith("train length 128, Canon-A width 3")
    assert "Canon" not in model_line(load_preset("state-tracking"))
    assert model_line(load_preset("retrieval", {"sweep.grid": {"model.canon": [0, 3]}})).endswith("Canon-A width swept")
