"""Each RoPE schedule on a Hugging Face model equals what transformers computes for the same L0, at every length.

The tiny Llama below has ``max_position_embeddings`` 4 x its native context L0 = 64
(``original_max_position_embeddings``, as a model extended after pretraining ships), so an L0 read from the wrong field
shows: the model's rotary embedding after ``Adaptation.set_schedule`` must equal posenc's ``SCHEDULES`` with L0 = 64 and
transformers' own rotary embedding (``ROPE_INIT_FUNCTIONS``, ``dynamic_rope_update``) built the way transformers
documents each type with that L0.
"""

import math
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402

from posenc import rope  # noqa: E402
from posenc.errors import PosencError  # noqa: E402
from posenc.hf.adaptation import Adaptation  # noqa: E402
from posenc.hf.schedules import Extension, extension_params  # noqa: E402

D, THETA, L0, S = 16, 10000.0, 64, 4.0
LISTS = {"short_factor": [1.0 + 0.1 * i for i in range(D // 2)], "long_factor": [1.0 + 0.5 * i for i in range(D // 2)]}
LENGTHS = (16, L0, L0 + 1, 2 * L0, 3 * L0, 4 * L0, 8 * L0)


def config(max_positions: int, rope_parameters: dict) -> transformers.LlamaConfig:
    return transformers.LlamaConfig(
        hidden_size=4 * D,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=32,
        max_position_embeddings=max_positions,
        rope_parameters={"rope_theta": THETA, **rope_parameters},
        attn_implementation="sdpa",
    )


def extended_model() -> transformers.LlamaForCausalLM:
    """Plain RoPE, native context L0 = 64 (``original_max_position_embeddings``), ``max_position_embeddings`` 256."""
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(
        config(4 * L0, {"rope_type": "default", "original_max_position_embeddings": L0})
    ).eval()


# each schedule as transformers writes it with L0 = 64: dynamic reads L0 from max_position_embeddings, the others
# from original_max_position_embeddings
REFERENCE = {
    "none": (4 * L0, {"rope_type": "default"}),
    "pi": (4 * L0, {"rope_type": "linear", "factor": S}),
    "dynamic": (L0, {"rope_type": "dynamic", "factor": S}),
    "yarn": (4 * L0, {"rope_type": "yarn", "factor": S, "original_max_position_embeddings": L0}),
    "llama3": (
        4 * L0,
        {
            "rope_type": "llama3",
            "factor": S,
            "original_max_position_embeddings": L0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
        },
    ),
    "longrope": (4 * L0, {"rope_type": "longrope", "factor": S, "original_max_position_embeddings": L0, **LISTS}),
}


def frequencies(rotary, length: int) -> tuple[torch.Tensor, float]:
    """inv_freq (D/2,) float64 and attention scaling of ``rotary`` for a forward of ``length`` positions."""
    rotary(torch.zeros(1), torch.arange(length)[None])  # dynamic NTK and LongRoPE pick their frequencies here
    return rotary.inv_freq.double(), float(rotary.attention_scaling)


@pytest.mark.parametrize("name", list(REFERENCE))
def test_each_schedule_equals_transformers_for_the_same_l0_at_every_length(name):
    model = extended_model()
    adapted = Adaptation(model)
    assert adapted.l0 == L0
    ext = Extension(name, S, **(LISTS if name == "longrope" else {}))
    adapted.set_schedule(ext)
    params = extension_params(ext, L0)
    for length in LENGTHS:
        adapted.reset_rotary()  # one forward's frequencies, as posenc extend scores each window
        got, got_af = frequencies(model.model.rotary_emb, length)
        want, want_af = rope.SCHEDULES[name](D, THETA, params, length)
        ref, ref_af = frequencies(LlamaRotaryEmbedding(config(*REFERENCE[name])), length)
        assert torch.allclose(got, want, rtol=1e-6, atol=0), (name, length)
        assert torch.allclose(ref, want, rtol=1e-6, atol=0), (name, length)
        assert got_af == pytest.approx(want_af, rel=1e-12) and ref_af == pytest.approx(want_af, rel=1e-12), (
            name,
            length,
        )


def test_dynamic_ntk_scales_past_the_native_context_not_past_max_position_embeddings():
    """The issue's case: at 2 L0 (below max_position_embeddings = 4 L0) dynamic NTK's base is raised, so its lowest
    frequency is below plain RoPE's; the model's generation limit stays its own."""
    model = extended_model()
    adapted = Adaptation(model)
    adapted.set_schedule(Extension("dynamic", S))
    got, _ = frequencies(model.model.rotary_emb, 2 * L0)
    plain = rope.rope_inv_freq(D, THETA)
    base = THETA * (S * 2 - (S - 1)) ** (D / (D - 2))
    assert torch.allclose(got, rope.rope_inv_freq(D, base), rtol=1e-6) and got[-1] < plain[-1] / 4
    assert model.config.max_position_embeddings == 4 * L0
    adapted.restore()
    assert model.model.rotary_emb.config is model.config


def rotary_buffers(model) -> dict[str, torch.Tensor]:
    return {n: b.clone() for n, b in model.model.rotary_emb.named_buffers() if b.is_floating_point()}


@pytest.mark.parametrize("name", [*rope.NAMES, "longrope"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_cast_never_lowers_the_rotary_frequencies(name, dtype):
    """After ``set_schedule``, ``model.to(bf16 / fp16)`` keeps every floating buffer of the rotary embedding
    (transformers' ``inv_freq``, ``original_inv_freq``; ReRoPE's stand-in) float32 and bit-equal, also after the dynamic
    update and a rebuild (``reset_rotary``); the weights are cast."""
    model = extended_model()
    adapted = Adaptation(model)
    adapted.set_schedule(Extension(name, S, window=8, leak=4.0, **(LISTS if name == "longrope" else {})))
    before = rotary_buffers(model)
    assert before and all(b.dtype == torch.float32 for b in before.values())
    model.to(dtype)
    assert model.model.embed_tokens.weight.dtype == dtype
    after = rotary_buffers(model)
    assert after.keys() == before.keys()
    for n, b in after.items():
        assert b.dtype == torch.float32 and torch.equal(b, before[n]), (name, n)
    with torch.inference_mode():
        model(torch.randint(0, 32, (1, 2 * L0)))  # dynamic NTK and LongRoPE update inv_freq here
    assert all(b.dtype == torch.float32 for b in rotary_buffers(model).values())
    adapted.reset_rotary()
    model.to(dtype)
    assert rotary_buffers(model).keys() == before.keys()
    assert all(torch.equal(b, before[n]) for n, b in rotary_buffers(model).items())


def qwen3_style_model() -> transformers.LlamaForCausalLM:
    """Only ``max_position_embeddings`` (80 = 1.25 x 64, as Qwen3's 40,960 = 1.25 x 32,768): its native context reads
    80."""
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config(80, {"rope_type": "default"})).eval()


def test_every_yarn_setting_and_the_original_length_can_be_given():
    """L0 = 64 given for a config with only max_position_embeddings 80, an explicit attention factor 1.0 and YaRN's
    beta_fast, beta_slow, truncate: the model's frequencies are transformers' for exactly that setting."""
    model = qwen3_style_model()
    adapted = Adaptation(model)
    assert adapted.l0 == 80
    tuned = {"attention_factor": 1.0, "beta_fast": 16.0, "beta_slow": 2.0, "truncate": False}
    with pytest.warns(
        UserWarning, match=r"^factor 4 differs from the model's max_position_embeddings / L0 = 80 / 64 = 1.25"
    ):
        adapted.set_schedule(Extension("yarn", S, original_max_position_embeddings=L0, **tuned))
    got, got_af = frequencies(model.model.rotary_emb, 2 * L0)
    ref, ref_af = frequencies(
        LlamaRotaryEmbedding(
            config(80, {"rope_type": "yarn", "factor": S, "original_max_position_embeddings": L0, **tuned})
        ),
        2 * L0,
    )
    default, default_af = frequencies(
        LlamaRotaryEmbedding(config(80, {"rope_type": "yarn", "factor": S, "original_max_position_embeddings": 80})),
        2 * L0,
    )
    assert torch.allclose(got, ref, rtol=1e-6, atol=0) and got_af == ref_af == 1.0
    assert not torch.allclose(got, default, rtol=1e-3) and default_af > 1.1  # the settings change something


def test_deepseek_yarn_mscale_can_be_given():
    """DeepSeek's YaRN (``mscale``, ``mscale_all_dim``; posenc refused both before): the model's frequencies and
    attention factor are transformers' for exactly those rope_parameters, and the factor is their ratio of mscales."""
    model = extended_model()
    deepseek = {"mscale": 1.0, "mscale_all_dim": 0.5}
    Adaptation(model).set_schedule(Extension("yarn", S, **deepseek))
    assert model.config.rope_parameters == {
        "rope_type": "yarn",
        "rope_theta": THETA,
        "factor": S,
        "original_max_position_embeddings": L0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": True,
        **deepseek,
    }
    got, got_af = frequencies(model.model.rotary_emb, 2 * L0)
    ref, ref_af = frequencies(LlamaRotaryEmbedding(config(4 * L0, {**REFERENCE["yarn"][1], **deepseek})), 2 * L0)
    assert torch.allclose(got, ref, rtol=1e-6, atol=0) and got_af == pytest.approx(ref_af, rel=1e-12)
    assert got_af == pytest.approx((0.1 * math.log(S) + 1) / (0.05 * math.log(S) + 1), rel=1e-12)


def test_llama3_bands_can_be_given():
    model = extended_model()
    Adaptation(model).set_schedule(Extension("llama3", S, low_freq_factor=2.0, high_freq_factor=8.0))
    got, _ = frequencies(model.model.rotary_emb, L0)
    ref, _ = frequencies(
        LlamaRotaryEmbedding(
            config(
                4 * L0,
                {
                    "rope_type": "llama3",
                    "factor": S,
                    "original_max_position_embeddings": L0,
                    "low_freq_factor": 2.0,
                    "high_freq_factor": 8.0,
                },
            )
        ),
        L0,
    )
    default, _ = frequencies(LlamaRotaryEmbedding(config(*REFERENCE["llama3"])), L0)
    assert torch.allclose(got, ref, rtol=1e-6, atol=0) and not torch.allclose(got, default, rtol=1e-3)


def test_the_original_length_reaches_dynamic_ntk_and_the_length_switch():
    model = qwen3_style_model()
    adapted = Adaptation(model)
    with pytest.warns(UserWarning, match="factor 4 differs"):
        adapted.set_schedule(Extension("dynamic", S, original_max_position_embeddings=L0))
    got, _ = frequencies(model.model.rotary_emb, 72)  # past L0 = 64, below max_position_embeddings = 80
    assert torch.allclose(got, rope.rope_inv_freq(D, THETA * (S * 72 / L0 - (S - 1)) ** (D / (D - 2))), rtol=1e-6)


def test_the_factor_warning_is_given_once_and_only_where_the_lengths_disagree():
    adapted = Adaptation(qwen3_style_model())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(3):
            adapted.set_schedule(Extension("pi", S, original_max_position_embeddings=L0))
        adapted.set_schedule(Extension("pi", 1.25, original_max_position_embeddings=L0))  # the config's ratio
        adapted.set_schedule(Extension("pi", S))  # L0 = max_position_embeddings: nothing to disagree with
        adapted.set_schedule(Extension("rerope", S, original_max_position_embeddings=L0))  # no factor
    assert [str(w.message) for w in caught] == [
        "factor 4 differs from the model's max_position_embeddings / L0 = 80 / 64 = 1.25: "
        "the schedule scales by 4, not by the config's ratio"
    ]


@pytest.mark.parametrize(
    "ext,message",
    [
        (Extension("pi", S, beta_fast=16.0), r"^rope schedule 'pi' takes factor; got beta_fast$"),
        (Extension("llama3", S, attention_factor=1.0), r"^rope schedule 'llama3' takes .*; got attention_factor$"),
        (Extension("none", S, truncate=False), r"^rope schedule 'none' takes no parameters; got truncate$"),
        (Extension("yarn", S, beta_fast=1.0, beta_slow=2.0), r"^yarn needs beta_fast > beta_slow > 0"),
        (Extension("yarn", S, attention_factor=0.0), r"attention_factor must be > 0, got 0.0$"),
        (Extension("yarn", S, mscale=1.0), r"^yarn: mscale and mscale_all_dim go together"),
        (Extension("llama3", S, mscale=1.0, mscale_all_dim=1.0), r"^rope schedule 'llama3' takes .*; got mscale, msc"),
        (
            Extension("yarn", S, original_max_position_embeddings=1),
            r"^original_max_position_embeddings \(L0\) must be an integer >= 2",
        ),
    ],
)
def test_a_setting_the_schedule_does_not_take_or_out_of_range_is_refused(ext, message):
    model = qwen3_style_model()
    adapted = Adaptation(model)
    with pytest.raises(PosencError, match=message):
        adapted.set_schedule(ext)
    assert model.config.rope_parameters["rope_type"] == "default"  # refused before the model changes


def test_a_rerope_window_of_zero_is_refused_not_the_default():
    """`--rerope-window 0` on a pretrained model became the default window (``ext.window or L0 // 4``), exit 0."""
    assert extension_params(Extension("rerope", factor=2.0, window=None), 8192) == {"window": 2048}
    for w in (0, -3):
        with pytest.raises(PosencError, match=f"window must be a positive integer, got {w}"):
            extension_params(Extension("rerope", factor=2.0, window=w), 8192)
