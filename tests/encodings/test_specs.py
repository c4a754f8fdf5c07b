"""Scheme specs NAME:key=value[,key=value] (per part of a composition) and the accumulated step laws."""

import inspect
import math
import re

import numpy as np
import pytest
import torch

from posenc import build_model, encodings
from posenc.cli.main import main
from posenc.encodings.accumulated import Accumulated
from posenc.encodings.base import Dims, Encoding, Inputs
from posenc.encodings.composite import Composite
from posenc.encodings.forget import ForgetGate
from posenc.encodings.rotary import RoPE
from posenc.errors import PosencError
from posenc.model import LM, ModelConfig, is_rope
from posenc.rope import rope_inv_freq

DIMS = Dims(n_head=2, head_dim=8, d_model=16, vocab_size=256, train_length=16)


def test_spec_parameters_reach_the_scheme():
    enc = encodings.get("acc-rand-qkv:a=0.3", DIMS)
    assert isinstance(enc, Accumulated) and enc.a == 0.3 and enc.rotate_v and enc.mode == "random"
    assert torch.allclose(enc.width_b, torch.full((4,), 0.3))
    rope = encodings.get("rope:rope_theta=500000", DIMS)
    assert isinstance(rope, RoPE)
    np.testing.assert_allclose(rope.inv_freq.numpy(), 500000.0 ** (-np.arange(0, 8, 2) / 8), rtol=1e-6)
    learned = encodings.get("acc-learned-qkv:init=random,learn_a=true", DIMS)
    assert learned.init == "random" and learned.log_a is not None and learned.step.weight.abs().sum() > 0


def test_spec_parameters_per_part_of_a_composition():
    enc = encodings.get("acc-rand-qkv:a=0.3,seed=4+alibi", DIMS)
    assert isinstance(enc, Composite) and enc.rotary_part.a == 0.3 and enc.rotary_part.seed == 4 * 1_000_003
    assert [type(p).__name__ for p in enc.parts] == ["Accumulated", "ALiBi"]


def test_named_composition_expands_to_its_parts():
    assert [c for c, _ in encodings.parts("hybrid")] == [Accumulated, ForgetGate]
    enc = encodings.get("hybrid", DIMS)
    assert enc.rotary_part.mode == "learned" and enc.rotary_part.rotate_v and enc.rotary_part.center == "zero"
    assert encodings.parts("hybrid") == encodings.parts("acc-learned-qkv+forget")


def test_spec_values_are_typed():
    _, params = encodings.resolve("accumulated:a=2,learn_a=true,mode=learned,rotate=qkv")
    assert params == {"a": 2, "learn_a": True, "mode": "learned", "rotate": "qkv"}
    assert isinstance(encodings.resolve("accumulated:a=0.25")[1]["a"], float)


@pytest.mark.parametrize(
    "spec,message",
    [
        ("acc-rand-qkv:b=1", "scheme 'acc-rand-qkv' has no parameter 'b'"),
        ("acc-rand-qkv:a", "expected key=value, got 'a'"),
        ("acc-rand-qkv:a=", "expected key=value"),
        ("acc-rand-qkv:a=-1", "half-width a must be in (0, pi]"),
        ("acc-rand-qkv:a=4", "half-width a must be in (0, pi]"),
        ("acc-rand-qkv:a=nan", "scheme 'acc-rand-qkv:a=nan': a=nan: must be a finite number"),
        ("rope:rope_theta=inf", "rope_theta=inf: must be a finite number"),
        ("rope+", "scheme spec 'rope+': the part after '+' is empty"),
        ("+rope", "scheme spec '+rope': the part before '+' is empty"),
        ("rope++alibi", "scheme spec 'rope++alibi': the part after '+' is empty"),
        ("rope:", "scheme spec 'rope:': empty parameter list after ':'"),
        ("rope|nope:", "scheme spec 'nope:': empty parameter list after ':'"),
        ("acc-rand-qkv:a=1e39", "half-width a must be in (0, pi]"),
        ("acc-rand-qkv:a=true", "a=True: expected float"),
        ("acc-rand-qkv:a=1,a=2", "duplicate key 'a'"),
        ("acc-learned-qkv:learn_a=yes", "learn_a='yes': expected bool"),
        ("acc-rand-qkv:seed=1.5", "seed=1.5: expected int"),
        ("rope:rope_theta=abc", "rope_theta='abc': expected float"),
        ("acc-drift-qkv:a=0.3", "a applies to center='zero'"),
        ("rope: rope_theta=5", "contains whitespace"),
        ("learn_a=true", "quote specs with ',' in YAML lists"),
        ("accumulated:mode=bogus", "mode must be one of random, token, learned"),
        ("accumulated:learn_a=true", "learn_a applies to mode='learned' only"),
        (
            "accumulated:center=rope,mode=learned,learn_a=true",
            "learn_a applies to mode='learned' and center='zero' only",
        ),
        ("acc-rand-qkv:rope_theta=500", "rope_theta applies to center='rope' only; here it would do nothing"),
        ("acc-rand-qk:init=random", "init applies to mode='learned' only"),
        ("acc-learned-qkv:seed=3", "seed applies to mode='random' or 'token' only"),
        ("acc-rand-qkv:mode=token", "'acc-rand-qkv' fixes mode='random'; use 'accumulated'"),
        ("kerple-power:variant=log", "'kerple-power' fixes variant='power'"),
        ("rope:schedule=yarn", "schedule cannot be set in a spec"),
        ("acc-rand-qkv:seed=-1", "seed must be in [0, 2^31)"),
        ("xpos:block_size=0", "block_size >= 1"),
        ("xpos:scale_base=0", "scale_base > 0"),
        ("t5:num_buckets=100000000000,max_distance=100000000001", "num_buckets <= 4096"),
        ("hybrid:a=1", "'hybrid' is a composition"),
        ("nosuch:a=1", "unknown scheme 'nosuch'"),
        (":a=1", "missing scheme name"),
        ("alibi:x=1", "scheme 'alibi' has no parameter 'x'"),
        ("acc-zero-qkv", "unknown scheme 'acc-zero-qkv'"),
        ("alibi+alibi:x=1", "has no parameter 'x'"),
    ],
)
def test_bad_specs_are_one_line_errors(spec, message):
    with pytest.raises(PosencError) as err:
        encodings.get(spec, DIMS)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "name", ["acc-rand-qk", "acc-rand-qkv", "acc-drift-qk", "acc-drift-qkv", "acc-token-qkv", "acc-learned-qkv"]
)
def test_the_valid_list_names_exactly_what_the_scheme_accepts(name):
    """Each parameter the "valid:" list names is accepted on its own; each settable one it leaves out is refused."""
    with pytest.raises(PosencError, match="valid: ") as err:
        encodings.get(f"{name}:nosuch=1", DIMS)
    valid = str(err.value).split("valid: ")[1].split(", ")
    samples = {
        "a": 0.5,
        "center": "zero",
        "init": "random",
        "learn_a": True,
        "pairing": "adjacent",
        "rope_theta": 500.0,
        "rotary_fraction": 0.5,
        "seed": 3,
        "mode": "random",
        "rotate": "qk",
    }
    for key in sorted(set(samples) - set(encodings.alias_of(name)[1])):
        spec = f"{name}:{key}={samples[key]}".replace("True", "true")
        if key in valid:
            encodings.get(spec, DIMS)
        else:
            with pytest.raises(PosencError, match="would do nothing"):
                encodings.get(spec, DIMS)


def test_a_swap_default_goes_only_to_the_parts_it_applies_to():
    """The Hugging Face swap's rope_theta default reaches RoPE and drift steps, not acc-rand-qkv (which ignores it)."""
    assert "rope_theta" not in encodings.get("acc-rand-qkv+alibi", DIMS, defaults={"rope_theta": 5e5}).parts[0].spec
    assert encodings.get("rope", DIMS, defaults={"rope_theta": 5e5}).rope_theta == 5e5
    drift = encodings.get("acc-drift-qkv", DIMS, defaults={"rope_theta": 5e5})
    torch.testing.assert_close(drift.center_b, rope_inv_freq(DIMS.head_dim, 5e5).float())


def test_plus_inside_a_value_does_not_split_the_spec():
    assert encodings.get("rope:rope_theta=1e+4", DIMS).rope_theta == 1e4
    assert len(encodings.parts("acc-rand-qkv:a=1e-1+alibi")) == 2


def test_a_parameter_given_twice_is_refused():
    with pytest.raises(PosencError, match="given both in the spec and separately"):
        encodings.get("acc-rand-qkv:a=0.3", DIMS, a=0.5)


def test_params_with_a_composition_are_refused():
    with pytest.raises(PosencError, match="give parameters per part"):
        encodings.get("acc-rand-qkv+alibi", DIMS, a=0.3)
    with pytest.raises(PosencError, match="give parameters per part"):
        build_model({"encoding": "hybrid", "encoding_params": {"a": 2.0}, "n_layer": 1, "d_model": 16, "n_head": 2})


def test_cli_rejects_a_bad_spec_with_exit_2(tmp_path, capsys):
    assert (
        main(
            ["train", "--scheme", "acc-rand-qkv:a=0", "--preset", "quick", "--steps", "1", "--out", str(tmp_path / "r")]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "half-width a must be" in err


def test_spec_is_stored_in_the_run_config_and_reloads(tmp_path):
    run = tmp_path / "r"
    assert (
        main(["train", "--scheme", "acc-rand-qkv:a=0.5+alibi", "--preset", "quick", "--steps", "2", "--out", str(run)])
        == 0
    )
    from posenc.train.rundir import load_run

    model = load_run(run)[0]
    assert model.cfg.encoding == "acc-rand-qkv:a=0.5+alibi" and model.blocks[0].attn.enc.rotary_part.a == 0.5


def test_a_taken_name_cannot_be_registered_again():
    class Other(Encoding):
        name = "rope"

    with pytest.raises(PosencError, match="'rope' is already registered"):
        encodings.register(Other)
    with pytest.raises(PosencError, match="'hybrid' is already registered"):
        encodings.alias("hybrid", "rope", "a second hybrid")
    assert encodings.resolve("rope")[0] is RoPE


# ---------------------------------------------------------------- step laws


@pytest.mark.parametrize("a", [0.1, 0.5, 1.0, 2.0, 3.0])
def test_random_step_law_gap(a):
    enc = encodings.get(f"acc-rand-qkv:a={a}", DIMS)
    np.testing.assert_allclose(enc.spectral_gap().numpy(), abs(math.sin(a) / a), rtol=1e-6)  # every block, Example 1


def test_default_random_steps():
    enc = encodings.get("acc-rand-qkv", DIMS)
    assert enc.center == "zero" and enc.a == 1.0 and enc.spectral_gap()[0] == pytest.approx(0.8415, abs=1e-4)


@torch.no_grad()
def _learned_steps(enc: Accumulated, x: torch.Tensor) -> torch.Tensor:
    inp = Inputs(x, torch.arange(x.shape[1]), torch.zeros(x.shape[:2], dtype=torch.int64))
    phi = enc.phases(inp).double()
    return (
        torch.remainder(torch.diff(phi, dim=-2, prepend=torch.zeros_like(phi[..., :1, :])) + math.pi, 2 * math.pi)
        - math.pi
    )


def test_learned_step_law_is_zero_centred_and_bounded():
    x = torch.randn(4, 64, 16, generator=torch.Generator().manual_seed(0))
    zero = encodings.get("acc-learned-qkv", DIMS)
    assert _learned_steps(zero, x).abs().max() < 1e-6  # W = 0 at init: no rotation (starts as NoPE, not RoPE)
    rand = encodings.get("acc-learned-qkv:init=random,a=2", DIMS)
    with torch.no_grad():
        rand.step.weight.normal_(std=3.0)  # saturate tanh: steps fill [-a, a]
    steps = _learned_steps(rand, x)
    assert steps.abs().max() <= 2.0 + 1e-5 and steps.abs().max() > 1.9
    assert abs(float(steps.mean())) < 0.1  # tanh(W x) is odd in x: zero-centred for symmetric inputs
    neg = _learned_steps(rand, -x)
    torch.testing.assert_close(neg, -steps, atol=1e-5, rtol=0)


def test_learned_half_width_is_a_parameter_that_trains():
    enc = encodings.get("acc-learned-qkv:learn_a=true,init=random", DIMS)
    assert enc.log_a.shape == (2, 4) and torch.allclose(enc.widths(), torch.ones(2, 4))
    x = torch.randn(1, 10, 16)
    inp = Inputs(x, torch.arange(10), torch.zeros(1, 10, dtype=torch.int64))
    enc.phases(inp).sum().backward()
    assert enc.log_a.grad is not None and enc.log_a.grad.abs().sum() > 0


def test_layer_pattern_repeats_over_layers():
    model = build_model(
        {"vocab_size": 32, "n_layer": 5, "n_head": 2, "d_model": 16, "train_length": 16, "encoding": "irope"}
    )
    assert [b.attn.enc.name for b in model.blocks] == ["rope", "rope", "rope", "nope", "rope"]
    model = build_model(
        {
            "vocab_size": 32,
            "n_layer": 3,
            "n_head": 2,
            "d_model": 16,
            "train_length": 16,
            "encoding": "acc-rand-qkv:a=0.5|alibi",
        }
    )
    assert [type(b.attn.enc).__name__ for b in model.blocks] == ["Accumulated", "ALiBi", "Accumulated"]
    assert model.blocks[2].attn.enc.a == 0.5 and model.blocks[2].attn.enc.seed == 2  # seed offset by the layer index
    assert model.token_nll(torch.randint(0, 32, (1, 8)), torch.randint(0, 32, (1, 8))).isfinite().all()
    assert encodings.describe("irope").startswith("per layer, repeating: rope(") and encodings.describe(
        "irope"
    ).endswith("| nope")
    assert not is_rope("irope") and is_rope("rope:rope_theta=500")


@pytest.mark.parametrize(
    "spec, message",
    [
        ("rope||nope", "empty layer entry"),
        ("", "scheme spec is empty: give a scheme name (posenc list shows them)"),
        (" ", "scheme spec is empty"),
        ("rope|nop", "unknown scheme 'nop'"),
        ("irope:rope_theta=5", "is a per-layer pattern"),
        ("rope|sinusoidal", "cannot be in a '|' pattern"),
        ("rope|acc-rand-qkv:a=9", "a must be in (0, pi]"),
        ("gemma3|nope", "the entry 'gemma3' is a per-layer pattern (rope:rope_theta=10000,window=1024|"),
        ("irope:window=4|rope", "the entry 'irope:window=4' is a per-layer pattern (rope|rope|rope|nope)"),
        ("gemma3+alibi", "'gemma3' is a per-layer pattern (rope:rope_theta=10000,window=1024|"),
        ("rope|irope+alibi", "'irope' is a per-layer pattern (rope|rope|rope|nope), not one layer's scheme"),
        ("rope|rope|nope", "scheme 'rope|rope|nope' is a pattern of 3 layer entries for a model of 2 layers"),
    ],
)
def test_bad_layer_patterns_are_one_line(spec, message):
    cfg = ModelConfig(vocab_size=32, n_layer=2, n_head=2, d_model=16, train_length=16, encoding=spec)
    with pytest.raises(PosencError, match=re.escape(message)):
        cfg.check_encoding()


@pytest.mark.parametrize(
    "build",
    [
        lambda cfg: build_model(cfg),
        lambda cfg: LM(ModelConfig(**cfg)),
        lambda cfg: ModelConfig(**cfg).check_encoding(),
        lambda cfg: ModelConfig(**cfg).distinct_layers(),
    ],
    ids=["build_model", "LM", "check_encoding", "distinct_layers"],
)
def test_a_pattern_longer_than_the_model_is_refused_by_every_entry_point(build):
    """gemma3 on 2 layers built its first two (local) entries and no global layer, without a word."""
    cfg = {"vocab_size": 32, "n_layer": 2, "n_head": 2, "d_model": 16, "train_length": 16, "encoding": "gemma3"}
    with pytest.raises(PosencError) as err:
        build(cfg)
    assert str(err.value) == (
        "scheme 'gemma3' is a pattern of 6 layer entries for a model of 2 layers: the entries past layer 2 would never "
        "be used; give at most 2 entries, or more layers"
    )


def test_a_shorter_pattern_repeats_also_where_it_does_not_divide_the_layers():
    """Layer i takes entry i mod n (docs/schemes.md): gemma3 on 8 layers is 5 local, 1 global, 2 local (Gemma 3 1B:
    26 layers of the 6-layer pattern)."""
    cfg = {"vocab_size": 32, "n_layer": 8, "n_head": 2, "d_model": 16, "train_length": 16, "encoding": "gemma3"}
    model = build_model(cfg)
    windows = [None if b.attn.enc.window is None else b.attn.enc.window.size for b in model.blocks]
    assert windows == [1024] * 5 + [None] + [1024] * 2
    assert [b.attn.enc.rope_theta for b in model.blocks] == [1e4] * 5 + [1e6] + [1e4] * 2


def test_every_scheme_documents_each_parameter_a_spec_may_set():
    for name in (n for n in encodings.names() if not encodings.alias_of(n)):
        cls, _ = encodings.resolve(name)
        settable = sorted(encodings.registry._accepted(cls) - set(cls.internal))
        assert sorted(encodings.registry.param_docs(cls)) == settable, (
            name
        )  # one line each, none for a parameter that is not there
        assert [p.name for p in encodings.parameters(name)] == [
            p for p in inspect.signature(cls.__init__).parameters if p in settable
        ]
        assert all(p.doc for p in encodings.parameters(name)), name


def test_parameters_give_defaults_and_meaning_an_alias_drops_those_it_fixes():
    rope = {p.name: p for p in encodings.parameters("rope")}
    assert list(rope) == ["rope_theta", "pairing", "rotary_fraction", "factor"]  # schedule(_params): not in a spec
    assert rope["rope_theta"] == encodings.Parameter(
        "rope_theta", 10000.0, "float", "the frequencies' base, a finite number > 1"
    )
    assert [p.name for p in encodings.parameters("acc-rand-qkv")] == [
        "center",
        "a",
        "init",
        "learn_a",
        "rope_theta",
        "pairing",
        "seed",
        "rotary_fraction",
    ]
    assert encodings.parameters("hybrid") == encodings.parameters("irope") == encodings.parameters("alibi") == []
    assert (
        encodings.alias_of("acc-rand-qkv") == ("accumulated", {"mode": "random", "rotate": "qkv"})
        and encodings.alias_of("rope") is None
    )
    with pytest.raises(PosencError, match="unknown scheme 'ropee'"):
        encodings.parameters("ropee")


@pytest.mark.parametrize(
    "spec, given",
    [
        ("acc-rand-qkv:a=0.5", {}),
        ("rope", {"rope_theta": 500000.0}),
        ("forget:scaled=true", {}),
        ("t5:num_buckets=8,max_distance=64", {}),
    ],
)
def test_a_scheme_repr_is_its_full_spec_that_rebuilds_it(spec, given):
    enc = encodings.get(spec, DIMS, **given)
    expect = {"acc-rand-qkv:a=0.5": "accumulated:mode=random,rotate=qkv,a=0.5", "rope": "rope:rope_theta=500000.0"}.get(
        spec, spec
    )
    assert enc.spec == expect and repr(enc).startswith(
        f"{type(enc).__name__}(\n  {expect}\n" if list(enc.children()) else f"{type(enc).__name__}({expect})"
    )
    again = encodings.get(enc.spec, DIMS)
    assert again.describe() == enc.describe() and again.spec == enc.spec


def test_repr_names_pretrained_defaults_and_the_parameters_a_spec_cannot_set():
    assert (
        repr(encodings.get("rope", DIMS, defaults={"rope_theta": 500000, "base": 3})) == "RoPE(rope:rope_theta=500000)"
    )
    model = build_model(
        ModelConfig(
            n_layer=1,
            n_head=2,
            d_model=16,
            train_length=16,
            encoding="rope",
            encoding_params={"schedule": "pi", "schedule_params": {"factor": 2.0}},
        )
    )
    enc = model.blocks[0].attn.enc
    assert (
        repr(enc) == f"RoPE(rope, schedule='pi', schedule_params={enc.schedule_params!r})"
        and enc.schedule_params["factor"] == 2.0
    )
    assert repr(RoPE(DIMS)) == "RoPE()"  # built directly, not from a spec
    parts = encodings.get("acc-rand-qkv:a=0.3+alibi", DIMS)
    assert [p.spec for p in parts.parts] == [
        "accumulated:mode=random,rotate=qkv,a=0.3",
        "alibi",
    ] and "acc-rand-qkv:a=0.3+alibi" in repr(parts)


@pytest.mark.parametrize(
    "params, message",
    [
        ({"center": "rope", "a": 0.5}, "a applies to center='zero' only"),
        ({"init": "random"}, "init applies to mode='learned' only"),
        (
            {"mode": "learned", "center": "rope", "learn_a": True},
            "learn_a applies to mode='learned' and center='zero' only",
        ),
        ({"mode": "learned", "seed": 3}, "seed applies to mode='random' or 'token' only"),
        ({"rope_theta": 500.0}, "rope_theta applies to center='rope' only"),
    ],
)
def test_a_scheme_built_directly_refuses_what_a_spec_refuses(params, message):
    """The constructor's check is ``applies_to``, the spec's: the same rule, the same line (no second copy of it)."""
    from posenc.encodings.accumulated import Accumulated

    with pytest.raises(PosencError) as err:
        Accumulated(DIMS, **params)
    assert str(err.value) == f"scheme 'accumulated': {message}; here it would do nothing"
    spec = "accumulated:" + ",".join(f"{k}={str(v).lower()}" for k, v in params.items())
    with pytest.raises(PosencError) as spec_err:
        encodings.get(spec, DIMS)
    assert str(spec_err.value) == str(err.value)
    Accumulated(DIMS, mode="learned", learn_a=True, init="random")  # each where it applies
    Accumulated(DIMS, center="rope", rope_theta=500.0)
