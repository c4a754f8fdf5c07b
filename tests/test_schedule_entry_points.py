"""Every RoPE schedule on every decoding entry point (the drop-in layer with LayerCache, the functional
prepare/attend, LM.decode): decoding equals the parallel forward of the prefix, across the schedules' L0, or the
entry point refuses the schedule in one line."""

import pytest
import torch

import posenc
from posenc import encodings
from posenc.encodings.base import Dims
from posenc.encodings.composite import Composite
from posenc.errors import PosencError
from posenc.model import Cache, build_model
from posenc.rope import SCHEDULES

L0, T, HALF = 8, 14, 8  # the schedules' original context, the decoded length, head dim 16 / 2
PARAMS = {
    "none": {},
    "rerope": {"window": 2},
    "leaky-rerope": {"window": 2, "leak": 4.0},
    "longrope": {
        "factor": 4.0,
        "short_factor": [1 + 0.1 * i for i in range(HALF)],
        "long_factor": [1 + i for i in range(HALF)],
    },
}
LENGTH_DEPENDENT = {"dynamic", "longrope"}  # frequencies follow the sequence length


def _params(schedule):
    return {"schedule": schedule, "schedule_params": PARAMS.get(schedule, {"factor": 2.0})}


def _layers(schedule, built: bool):
    """Two drop-in layers of L0 = 8 under ``schedule``, by ``params=`` or as a built Encoding, weights std 0.5 (a
    stale cached input moves the output by far more than rounding)."""
    torch.manual_seed(0)
    out = []
    for i in range(2):
        if built:
            enc = encodings.get("rope", Dims(2, 16, 32, 0, L0, i), **_params(schedule))
            layer = posenc.Attention(32, 2, scheme=enc, train_length=L0)
        else:
            layer = posenc.Attention(32, 2, scheme="rope", train_length=L0, params=_params(schedule))
        for p in layer.parameters():
            torch.nn.init.normal_(p, 0, 0.5)
        out.append(layer.double().eval())
    return out


def _stack(layers, x, caches=None):
    for layer, cache in zip(layers, caches or [None] * len(layers)):
        x = x + layer(x, cache=cache)
    return x


@pytest.mark.parametrize("built", [False, True], ids=["params", "encoding"])
@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_drop_in_layers_decode_as_the_prefix_forward_or_refuse_the_schedule(schedule, built):
    layers, x = _layers(schedule, built), torch.randn(2, T, 32, dtype=torch.float64)
    caches = [posenc.LayerCache() for _ in layers]
    with torch.no_grad():
        if schedule in LENGTH_DEPENDENT:
            with pytest.raises(PosencError, match="changes its frequencies with the sequence length") as exc:
                _stack(layers, x[:, :3], caches)
            assert "\n" not in str(exc.value)
            return
        start = 0
        for end in (3, *range(4, T + 1)):  # a prefill, then one position at a time, across L0 = 8
            err = (_stack(layers, x[:, start:end], caches) - _stack(layers, x[:, :end])[:, start:]).abs().max().item()
            assert err < 1e-10, (start, end, err)
            start = end


def test_a_composite_with_a_length_dependent_part_is_refused_by_the_drop_in_layer():
    dims = Dims(2, 16, 32, 0, L0)
    enc = Composite(dims, [encodings.get("rope", dims, **_params("dynamic")), encodings.get("alibi", dims)], "r+a")
    layer = posenc.Attention(32, 2, scheme=enc, train_length=L0).eval()
    assert enc.length_key(4) is not None and enc.length_key(4) != enc.length_key(12)
    with pytest.raises(PosencError, match="changes its frequencies"):
        layer(torch.randn(1, 3, 32), cache=posenc.LayerCache())


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_functional_prepare_attend_decodes_as_the_prefix_forward(schedule):
    """prepare over the prefix so far, attend with its last query: the module's forward of that prefix, last row;
    the ReRoPE schedules (they replace attention) take every query and refuse a suffix in one line."""
    (layer, _), x = _layers(schedule, built=False), torch.randn(2, T, 32, dtype=torch.float64)
    with torch.no_grad():
        for end in range(3, T + 1):
            q, k, v = layer.project(x[:, :end])
            prepared = posenc.prepare(layer.enc, x[:, :end])
            if layer.enc.replaces_attention:
                with pytest.raises(PosencError, match="attends with all T queries") as exc:
                    posenc.attend(q[:, :, -1:], k, v, prepared)
                assert "\n" not in str(exc.value)
                out = posenc.attend(q, k, v, prepared)[:, :, -1:]
            else:
                out = posenc.attend(q[:, :, -1:], k, v, prepared)
            got = layer.proj(out.transpose(1, 2).reshape(2, 1, 32))
            err = (got - layer(x[:, :end])[:, -1:]).abs().max().item()
            assert err < 1e-10, (end, err)


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_lm_decodes_as_the_prefix_forward_across_L0(schedule):
    cfg = {"encoding": "rope", "n_layer": 2, "n_head": 2, "d_model": 32, "train_length": L0}
    m = build_model({**cfg, "encoding_params": _params(schedule)}).double().eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.5)
        x, cache, start = torch.randint(0, 256, (2, T)), Cache(2), 0
        for end in (3, *range(4, T + 1)):
            err = (m.decode(x[:, start:end], cache) - m(x[:, :end])[:, start:]).abs().max().item()
            assert err < 1e-10, (start, end, err)
            start = end
