"""RoPE schedules: golden equality with transformers' ROPE_INIT_FUNCTIONS; ReRoPE against the full matrix; bad input."""

import math

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from posenc import encodings
from posenc.attention import attention, rotate
from posenc.encodings.base import Dims, Inputs
from posenc.errors import PosencError
from posenc.model import build_model, with_rope_schedule
from posenc.rope import SCHEDULES, check_window, rerope_attention, rope_inv_freq, schedule_params

D, THETA, L0 = 64, 10000.0, 128


def hf(rope_type, seq_len=None, **params):
    cfg = transformers.LlamaConfig(
        hidden_size=4 * D,
        num_attention_heads=4,
        head_dim=D,
        max_position_embeddings=L0,
        rope_parameters={"rope_type": rope_type, "rope_theta": THETA, **params},
    )
    inv, af = ROPE_INIT_FUNCTIONS[rope_type](cfg, "cpu", seq_len=seq_len)
    return inv.double(), af


def ours(name, seq_len=None, **params):
    return SCHEDULES[name](D, THETA, schedule_params(name, L0, params), seq_len)


@pytest.mark.parametrize("factor", [2.0, 8.0, 32.0])
def test_pi_and_llama3_equal_transformers(factor):
    for name, hf_name, extra in (
        ("pi", "linear", {}),
        ("llama3", "llama3", {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": L0}),
    ):
        inv, af = ours(name, factor=factor)
        ref, ref_af = hf(hf_name, factor=factor, **extra)
        assert torch.allclose(inv, ref, rtol=1e-6, atol=0) and af == ref_af == 1.0


@pytest.mark.parametrize(
    "factor,extra",
    [
        (8.0, {}),
        (4.0, {"truncate": False}),
        (16.0, {"beta_fast": 16.0, "beta_slow": 2.0}),
        (8.0, {"attention_factor": 1.5}),
    ],
)
def test_yarn_equals_transformers(factor, extra):
    inv, af = ours("yarn", factor=factor, **extra)
    ref, ref_af = hf("yarn", factor=factor, original_max_position_embeddings=L0, **extra)
    assert torch.allclose(inv, ref, rtol=1e-6, atol=0)
    assert af == pytest.approx(ref_af, rel=1e-12)
    if "attention_factor" in extra:
        assert af == 1.5  # an explicit factor wins
    else:
        assert af == pytest.approx(0.1 * math.log(factor) + 1)
    omega = rope_inv_freq(D, THETA)
    assert inv[0] == omega[0] and inv[-1] == pytest.approx(omega[-1] / factor)  # high kept, low interpolated


@pytest.mark.parametrize("mscale,mscale_all_dim", [(0.707, 0.707), (1.0, 0.5), (0.8, 1.2)])
def test_deepseek_yarn_equals_transformers(mscale, mscale_all_dim):
    """DeepSeek's YaRN (rope_parameters with mscale, mscale_all_dim, as DeepSeek-V2/V3 ship them) on transformers'
    DeepseekV3 rotary embedding and attention: the rotary dim's frequencies, the attention factor
    mscale(s, m) / mscale(s, a) and the softmax scale's mscale(s, a)^2 (``yarn_apply_mscale``) are posenc's."""
    from transformers.modeling_rope_utils import yarn_apply_mscale
    from transformers.models.deepseek_v3 import DeepseekV3Config

    from posenc.rope.schedules import yarn_logit_scale

    factor, rope_dim = 40.0, 16
    params = {"factor": factor, "mscale": mscale, "mscale_all_dim": mscale_all_dim, "beta_fast": 32, "beta_slow": 1}
    rope_parameters = {"rope_type": "yarn", "rope_theta": THETA, "original_max_position_embeddings": L0, **params}
    cfg = DeepseekV3Config(
        hidden_size=64,
        num_attention_heads=2,
        qk_rope_head_dim=rope_dim,
        qk_nope_head_dim=32,
        v_head_dim=32,
        max_position_embeddings=int(factor) * L0,
        rope_parameters=rope_parameters,
    )
    ref, ref_af = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
    p = schedule_params("yarn", L0, params)
    inv, af = SCHEDULES["yarn"](rope_dim, THETA, p)
    assert torch.allclose(inv, ref.double(), rtol=1e-6, atol=0)
    assert af == pytest.approx(ref_af, rel=1e-12)
    assert af == pytest.approx((0.1 * mscale * math.log(factor) + 1) / (0.1 * mscale_all_dim * math.log(factor) + 1))
    assert (af == pytest.approx(1.0)) == (mscale == mscale_all_dim)  # DeepSeek-V2 and V3 set them equal
    assert yarn_logit_scale(p) == pytest.approx(yarn_apply_mscale(rope_parameters, 1.0), rel=1e-12)
    assert yarn_logit_scale(p) == pytest.approx((0.1 * mscale_all_dim * math.log(factor) + 1) ** 2)
    assert yarn_logit_scale(schedule_params("yarn", L0, {"factor": factor})) == 1.0  # plain YaRN: no whole-score scale


@pytest.mark.parametrize("seq_len", [100, 128, 300, 1024])
def test_dynamic_ntk_equals_transformers_and_is_never_stale(seq_len):
    inv, _ = ours("dynamic", seq_len=seq_len, factor=4.0)
    ref, _ = hf("dynamic", seq_len=seq_len, factor=4.0)
    assert torch.allclose(inv, ref, rtol=1e-6, atol=0)
    dims = Dims(n_head=1, head_dim=D, d_model=D, vocab_size=256, train_length=L0)
    rope = encodings.get("rope", dims, schedule="dynamic", schedule_params={"factor": 4.0})

    def phases(T):
        return rope.phases(Inputs(torch.zeros(1, T, D), torch.arange(T), torch.zeros(1, T, dtype=torch.long)))

    long = phases(4096)
    short = phases(seq_len)  # after a longer input: computed from this length only
    want = (torch.arange(seq_len, dtype=torch.float64)[:, None] * inv).remainder(2 * math.pi).float()
    assert torch.allclose(short[0, 0], want, atol=1e-5)
    assert not torch.allclose(long[0, 0, :seq_len], short[0, 0], atol=1e-3)  # a stale base would match `long`


SHORT = [1.0 + 0.05 * i for i in range(D // 2)]  # LongRoPE lists as a model ships them (D/2 each)
LONG = [1.0 + 0.5 * i for i in range(D // 2)]


@pytest.mark.parametrize("factor,attention_factor", [(8.0, None), (32.0, None), (1.0, None), (4.0, 1.3)])
@pytest.mark.parametrize("seq_len", [None, 100, L0, L0 + 1, 4 * L0])
def test_longrope_equals_transformers(factor, attention_factor, seq_len):
    """Frequencies omega_i / short_i up to L0 (seq_len <= L0 or unknown), omega_i / long_i past it; attention factor
    sqrt(1 + ln s / ln L0) unless given; equal to transformers' _compute_longrope_parameters, float32 rounding."""
    from transformers.modeling_rope_utils import _compute_longrope_parameters

    params = {"factor": factor, "short_factor": SHORT, "long_factor": LONG, "attention_factor": attention_factor}
    inv, af = ours("longrope", seq_len=seq_len, **params)
    cfg = transformers.LlamaConfig(
        hidden_size=4 * D,
        num_attention_heads=4,
        head_dim=D,
        max_position_embeddings=L0,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": THETA,
            "original_max_position_embeddings": L0,
            **{k: v for k, v in params.items() if v is not None},
        },
    )
    ref, ref_af = _compute_longrope_parameters(cfg, "cpu", seq_len=seq_len)
    assert torch.allclose(inv, ref.double(), rtol=1e-6, atol=0) and af == pytest.approx(ref_af, rel=1e-12)
    ext = LONG if seq_len is not None and seq_len > L0 else SHORT  # the switch: L0 itself keeps the short list
    assert torch.allclose(inv, rope_inv_freq(D, THETA) / torch.tensor(ext, dtype=torch.float64), rtol=1e-12)
    assert af == (attention_factor or (math.sqrt(1 + math.log(factor) / math.log(L0)) if factor > 1 else 1.0))


def test_a_phi3_config_is_longrope_with_factor_from_its_lengths():
    """Phi-3 leaves factor unset: transformers takes max_position_embeddings / original (32 here); posenc's longrope
    with that factor gives its frequencies and attention factor, and its rotary switches lists past L0."""
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    cfg = transformers.Phi3Config(
        hidden_size=4 * D,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=32 * L0,
        original_max_position_embeddings=L0,
        rope_parameters={"rope_type": "longrope", "rope_theta": THETA, "short_factor": SHORT, "long_factor": LONG},
    )
    rotary = Phi3RotaryEmbedding(cfg)
    for T, long in ((L0, False), (L0 + 1, True)):
        rotary(torch.zeros(1), torch.arange(T)[None])  # transformers picks the list for this forward
        inv, af = ours("longrope", seq_len=T, factor=32.0, short_factor=SHORT, long_factor=LONG)
        assert torch.allclose(rotary.inv_freq.double(), inv, rtol=1e-6) and rotary.attention_scaling == pytest.approx(
            af, rel=1e-12
        )
        assert af == pytest.approx(math.sqrt(1 + math.log(32) / math.log(L0)))
        assert torch.allclose(inv, rope_inv_freq(D, THETA) / torch.tensor(LONG if long else SHORT, dtype=torch.float64))


def test_longrope_through_hf_rope_parameters():
    from posenc.hf.rope_parameters import hf_rope_parameters

    params = schedule_params("longrope", L0, {"factor": 8.0, "short_factor": SHORT, "long_factor": LONG})
    rp = hf_rope_parameters("longrope", params, THETA, D)
    assert rp == {
        "rope_type": "longrope",
        "rope_theta": THETA,
        "factor": 8.0,
        "original_max_position_embeddings": L0,
        "short_factor": SHORT,
        "long_factor": LONG,
    }
    for seq_len in (None, 2 * L0):
        inv, af = hf("longrope", seq_len, **{k: v for k, v in rp.items() if k not in ("rope_type", "rope_theta")})
        want, want_af = ours("longrope", seq_len=seq_len, factor=8.0, short_factor=SHORT, long_factor=LONG)
        assert torch.allclose(inv, want, rtol=1e-6) and af == pytest.approx(want_af, rel=1e-12)
    with pytest.raises(PosencError, match=r"^longrope: short_factor has 32 entries; head dim 32 needs 16$"):
        hf_rope_parameters("longrope", params, THETA, 32)


@pytest.mark.parametrize(
    "params,msg",
    [
        ({"factor": 4.0}, "rope schedule 'longrope' needs long_factor, short_factor"),
        (
            {"factor": 4.0, "short_factor": SHORT, "long_factor": [1.0, 0.0]},
            r"long_factor must be a non-empty list of finite numbers > 0",
        ),
        ({"factor": 4.0, "short_factor": [], "long_factor": LONG}, "short_factor must be a non-empty list"),
        ({"factor": 4.0, "short_factor": 2.0, "long_factor": LONG}, "short_factor must be a non-empty list"),
        (
            {"factor": 4.0, "short_factor": SHORT, "long_factor": [float("nan")] * (D // 2)},
            "long_factor must be a non-empty list",
        ),
        ({"factor": 0.5, "short_factor": SHORT, "long_factor": LONG}, "factor must be from 1 to 1e\\+06"),
    ],
)
def test_bad_longrope_input(params, msg):
    with pytest.raises(PosencError, match=msg) as exc:
        schedule_params("longrope", L0, params)
    assert "\n" not in str(exc.value)


def test_longrope_lists_must_fit_the_head_dim_and_are_never_a_default():
    from posenc.rope import NAMES, check_name

    with pytest.raises(PosencError, match=r"^longrope: long_factor has 16 entries; head dim 64 needs 32$"):
        ours("longrope", seq_len=2 * L0, factor=4.0, short_factor=SHORT, long_factor=SHORT[:16])
    assert "longrope" not in NAMES and check_name("longrope") == "longrope"  # a model ships the lists: no default run


def test_ntk_base_rescale_interpolates_lowest_frequency_by_s():
    inv, af = ours("ntk", factor=8.0)
    omega = rope_inv_freq(D, THETA)
    assert inv[0] == omega[0] and inv[-1].item() == pytest.approx(omega[-1].item() / 8, rel=1e-12) and af == 1.0


def test_yarn_logit_scale_is_attention_factor_squared():
    dims = Dims(n_head=1, head_dim=D, d_model=D, vocab_size=256, train_length=L0)
    rope = encodings.get("rope", dims, schedule="yarn", schedule_params={"factor": 8.0})
    assert rope.logit_scale == pytest.approx((0.1 * math.log(8) + 1) ** 2)


@pytest.mark.parametrize("leak", [None, 4.0])
def test_rerope_equals_full_matrix_with_clamped_positions(leak):
    T, Dh, w = 40, 8, 6
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, T, Dh, dtype=torch.float64, generator=g, requires_grad=True) for _ in range(3))
    inv = rope_inv_freq(Dh)
    pos = torch.arange(T)
    fast = rerope_attention(q, k, v, inv, w, leak, block_size=7)
    rel = (pos[:, None] - pos[None, :]).double()
    rel = torch.where(rel < w, rel, w + (rel - w) / leak if leak else torch.full_like(rel, w))
    # reference: score of (i, j) = <R(rel) q_i, k_j>, built entry by entry (T x T)
    phi = rel[..., None] * inv  # (T, T, D/2)
    rq = rotate(q[:, :, :, None, :].expand(-1, -1, -1, T, -1), phi)
    scores = (rq * k[:, :, None, :, :]).sum(-1) / math.sqrt(Dh)
    ref = torch.softmax(scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf")), -1) @ v
    assert torch.allclose(fast, ref, atol=1e-10)
    for a, b in zip(torch.autograd.grad(fast.sum(), (q, k, v)), torch.autograd.grad(ref.sum(), (q, k, v))):
        assert torch.allclose(a, b, atol=1e-10)
    plain = attention(q, k, v, phases=(pos.double()[:, None] * inv)[None, None])
    assert not torch.allclose(fast, plain, atol=1e-3)


def test_schedule_applies_to_trained_rope_model():
    model = build_model({"n_layer": 1, "n_head": 2, "d_model": 32, "train_length": 16})
    tokens = torch.randint(0, 256, (1, 64))
    ext, label = with_rope_schedule(model, "yarn", {"factor": 4.0})
    assert label == "rope+yarn(s=4)"
    assert ext.blocks[0].attn.enc.logit_scale == pytest.approx((0.1 * math.log(4) + 1) ** 2)
    assert not torch.allclose(ext(tokens), model(tokens), atol=1e-4)
    rr, label = with_rope_schedule(model, "rerope", {"window": 8})
    assert label == "rope+rerope(w=8)"
    # within the window ReRoPE is plain RoPE (a generation's first steps; evaluations refuse such a length)
    torch.testing.assert_close(rr(tokens[:, :8]), model(tokens[:, :8]))
    assert torch.isfinite(rr(tokens)).all()
    seq = tokens[:, :5]  # a prompt shorter than the window: generate refused it ("the evaluation length 5")
    for _ in range(12):  # greedy by full forwards, across the window
        seq = torch.cat((seq, rr(seq)[:, -1:].argmax(-1)), dim=1)
    assert torch.equal(rr.generate(tokens[:, :5], 12, temperature=0), seq)


@pytest.mark.parametrize(
    "name,params,msg",
    [
        ("yarn", {"factor": 0.5}, "factor must be from 1 to 1e\\+06"),
        ("yarn", {"factor": float("inf")}, "factor must be finite, got inf"),
        ("ntk", {"factor": 1e308}, "factor must be from 1 to 1e\\+06, got 1e\\+308"),  # an OverflowError
        ("yarn", {"factor": 4, "beta_fast": 1e308}, "beta_fast must be at most 1e\\+06 in size"),  # math domain error
        ("yarn", {"factor": 4, "original_max_position_embeddings": 0}, r"\(L0\) must be an integer from 2 to 2\^40"),
        ("dynamic", {"factor": 4, "original_max_position_embeddings": -1}, r"\(L0\) must be an integer from 2"),
        ("llama3", {"factor": 4, "original_max_position_embeddings": 64.0}, r"\(L0\) must be an integer from 2"),
        ("yarn", {"factor": 2, "attention_factor": 0.0}, "attention_factor must be > 0, got 0.0"),
        ("yarn", {"factor": 2, "attention_factor": float("inf")}, "attention_factor must be finite"),
        ("leaky-rerope", {"window": 4, "leak": float("inf")}, "leak must be finite"),
        ("yarn", {"factor": 4, "beta_fast": 1, "beta_slow": 1}, "beta_fast > beta_slow"),
        ("yarn", {"factor": 4, "mscale": 1.0}, "^yarn: mscale and mscale_all_dim go together"),
        ("yarn", {"factor": 4, "mscale": 0, "mscale_all_dim": 1}, r"^yarn: mscale must be > 0 \(leave it unset"),
        ("yarn", {"factor": 4, "mscale": 1, "mscale_all_dim": -1}, "^yarn: mscale_all_dim must be > 0"),
        (
            "yarn",
            {"factor": 4, "mscale": 1, "mscale_all_dim": 1, "attention_factor": 1.2},
            "^yarn: give attention_factor or mscale and mscale_all_dim, not both",
        ),
        ("pi", {"factor": 2, "mscale": 1.0}, "takes factor; got mscale"),
        ("rerope", {"window": 0}, "window must be a positive integer"),
        ("rerope", {}, "needs window"),
        ("leaky-rerope", {"window": 4, "leak": 0.5}, "leak k must be > 1"),
        ("nope", {}, "unknown rope schedule 'nope'"),
        ("pi", {"factor": 2, "window": 3}, "takes factor; got window"),
    ],
)
def test_bad_schedule_input(name, params, msg):
    with pytest.raises(PosencError, match=msg):
        schedule_params(name, L0, params)
    with pytest.raises(PosencError, match="must be < the evaluation length 64"):
        check_window({"window": 64}, 64)


@pytest.mark.parametrize(
    "spec,why",
    [
        ("alibi", "'alibi' is not plain RoPE"),
        ("rope+forget", "'rope+forget' is not plain RoPE"),
        # a pattern of RoPE layers only: "apply to RoPE models" named no reason
        (
            "rope|rope",
            "'rope|rope' is a per-layer pattern of 2 entries: a schedule is set on the model's one scheme "
            "spec, not per layer entry",
        ),
        ("gemma3", "'gemma3' is a per-layer pattern of 6 entries: a schedule is set on the model's one scheme spec"),
    ],
)
def test_schedule_rejects_a_model_that_is_not_one_plain_rope_spec(spec, why):
    cfg = {"n_layer": 6, "n_head": 2, "d_model": 32, "train_length": 16, "encoding": spec}
    with pytest.raises(PosencError) as err:
        with_rope_schedule(build_model(cfg), "yarn", {"factor": 2})
    assert str(err.value).startswith(
        f"rope schedules apply to models whose every layer is one plain RoPE spec; this run's {why}"
    )


def test_preset_eval_schedules_are_validated_before_training():
    from posenc.config.plan import load_preset

    preset = load_preset(
        "quick", {"eval_schedules": [{"schedule": "yarn", "factor": 4}, {"schedule": "rerope", "window": 8}]}
    )
    assert len(preset.eval_schedules) == 2
    with pytest.raises(PosencError, match="factor must be from 1 to 1e\\+06"):
        load_preset("quick", {"eval_schedules": [{"schedule": "yarn", "factor": 0.5}]})
    with pytest.raises(PosencError, match="window 32 must be < the evaluation length 32"):
        load_preset("quick", {"eval_schedules": [{"schedule": "rerope", "window": 32}]})


def test_own_model_longrope_switches_lists_past_the_training_length():
    import torch

    from posenc import encodings, rope
    from posenc.encodings.base import Dims, Inputs

    dims = Dims(n_head=2, head_dim=8, d_model=16, vocab_size=16, train_length=16)
    params = {"factor": 4.0, "short_factor": [1.0, 1.5, 2.0, 3.0], "long_factor": [2.0, 4.0, 8.0, 16.0]}
    enc = encodings.get("rope", dims, schedule="longrope", schedule_params=params)
    full = rope.schedule_params("longrope", 16, params)
    x = torch.zeros(1, 32, 16)
    for T in (16, 17, 32):
        phases = enc.phases(Inputs(x=x[:, :T], pos=torch.arange(T)))
        inv_freq, _ = rope.SCHEDULES["longrope"](8, enc.rope_theta, full, T)
        want = (T - 1) * inv_freq.double()  # phases are wrapped: compare the rotation
        assert torch.allclose(torch.cos(phases[0, 0, -1].double()), torch.cos(want), atol=1e-5)
        assert torch.allclose(torch.sin(phases[0, 0, -1].double()), torch.sin(want), atol=1e-5)
    short, _ = rope.SCHEDULES["longrope"](8, enc.rope_theta, full, 16)
    long, _ = rope.SCHEDULES["longrope"](8, enc.rope_theta, full, 17)
    assert not torch.allclose(short, long)


def test_eval_flags_give_the_longrope_factor_lists():
    """``posenc eval --short-factor/--long-factor`` comma lists are the schedule's lists: omega / short up to the
    training length, omega / long past it."""
    from posenc.cli.eval_cmd import schedule_args
    from posenc.cli.main import build_parser

    args = build_parser().parse_args(
        [
            "eval",
            "run",
            "--rope-schedule",
            "longrope",
            "--factor",
            "4",
            "--short-factor",
            "1,1.5,2,3",
            "--long-factor",
            "2,4,8,16.5",
        ]
    )
    model = build_model({"n_layer": 1, "n_head": 2, "d_model": 16, "train_length": 16})
    ext, label = with_rope_schedule(model, "longrope", schedule_args(args))
    full = ext.blocks[0].attn.enc.schedule_params
    assert (full["short_factor"], full["long_factor"], label) == (
        [1.0, 1.5, 2.0, 3.0],
        [2.0, 4.0, 8.0, 16.5],
        "rope+longrope(s=4)",
    )
    long, _ = SCHEDULES["longrope"](8, 10000.0, full, 17)
    assert torch.allclose(long, rope_inv_freq(8, 10000.0) / torch.tensor([2.0, 4.0, 8.0, 16.5], dtype=torch.float64))
