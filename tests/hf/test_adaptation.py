"""posenc.hf.adaptation.Adaptation: each adaptation of a Hugging Face model owns its state and its reuse key.

On a tiny Llama (2 layers, 4 heads over 2 key/value heads, head dim 16, native context 64): no ``posenc_*``
attribute and no leftover hook on any transformers object, applied or restored; restoring gives the native
logits bit for bit; the key changes with every mutation and stays equal where forwards are equal, so
``posenc extend`` still reuses those scores.
"""

import json
import re

import pytest
import torch
from tiny_llama import tiny_llama

from posenc.errors import PosencError

transformers = pytest.importorskip("transformers")
from posenc.cli.main import main  # noqa: E402
from posenc.hf import scheme as hf  # noqa: E402
from posenc.hf.adaptation import Adaptation  # noqa: E402
from posenc.hf.schedules import Extension  # noqa: E402
from posenc.rope import NAMES  # noqa: E402

L0 = 64
LISTS = {"short_factor": tuple(1.0 + 0.1 * i for i in range(8)), "long_factor": tuple(1.0 + 0.5 * i for i in range(8))}
SCHEMES = ("rope", "alibi", "xpos")  # identical to the model, a bias, a scheme that replaces attention


def llama(seed=0):
    return tiny_llama(seed, L0, 5000.0, attn_implementation="sdpa")


def extension(name):
    return Extension(name, 2.0, window=8, leak=4.0, **(LISTS if name == "longrope" else {}))


def every_adaptation():
    """(label, apply) for every RoPE schedule and a few schemes."""
    return (
        [(n, lambda a, n=n: a.set_schedule(extension(n))) for n in NAMES]
        + [("longrope", lambda a: a.set_schedule(extension("longrope")))]
        + [(f"scheme:{s}", lambda a, s=s: a.set_scheme(s)) for s in SCHEMES]
    )


def posenc_attributes(model) -> list[str]:
    """Every attribute, submodule, parameter or buffer named posenc_* on the model, its modules or its config."""
    found = [f"config.{k}" for k in vars(model.config) if k.startswith("posenc")]
    for name, m in model.named_modules():
        found += [
            f"{name}.{k}" for k in (*vars(m), *m._modules, *m._parameters, *m._buffers) if k.startswith("posenc_")
        ]
    return found


def hooks(model) -> dict:
    return {name: (len(m._forward_pre_hooks), len(m._forward_hooks)) for name, m in model.named_modules()}


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def test_no_state_on_the_model_applied_or_restored():
    model = llama()
    native_hooks, native_rope, native_attn = (
        hooks(model),
        dict(model.config.rope_parameters),
        model.config._attn_implementation,
    )
    adapted = Adaptation(model)
    for label, apply in every_adaptation():
        apply(adapted)
        assert posenc_attributes(model) == [], label
        added = sum(a + b for a, b in hooks(model).values()) - sum(a + b for a, b in native_hooks.values())
        # the hooks the adaptation owns: the length switch (dynamic, longrope), one per layer (ReRoPE),
        # padding + per layer (scheme)
        assert added == {"dynamic": 1, "longrope": 1, "rerope": 2, "leaky-rerope": 2}.get(
            label, 3 if "scheme" in label else 0
        ), label
        assert len(adapted._hooks) + (len(adapted.scheme.hooks) if adapted.scheme else 0) == added
        assert any(hasattr(layer.self_attn, "posenc") for layer in model.model.layers) == label.startswith("scheme:")
        assert adapted.full_forward == (label == "scheme:xpos")  # xPos replaces attention: generation without the cache
        adapted.restore()
        assert posenc_attributes(model) == [] and hooks(model) == native_hooks, label
        assert not any(hasattr(layer.self_attn, "posenc") for layer in model.model.layers)
        assert model.config.rope_parameters == native_rope and model.config._attn_implementation == native_attn
        assert (adapted.extension, adapted.rerope, adapted.scheme) == (Extension("none"), None, None)


def test_restoring_gives_the_native_logits_bit_exactly():
    model, ids = llama(1), torch.randint(0, 128, (2, 40))
    native = logits(model, ids)
    adapted = Adaptation(model)
    for label, apply in every_adaptation():
        apply(adapted)
        changed = logits(model, ids)
        if label not in (
            "none",
            "scheme:rope",
            "rerope",
            "dynamic",
        ):  # rerope: w = 8 < 40 changes it; none, dynamic at T <= L0 do not
            assert not torch.allclose(changed, native, atol=1e-4), label
        adapted.restore()
        assert torch.equal(logits(model, ids), native), label
        apply(adapted)
        adapted.set_schedule(Extension("none"))
        assert torch.equal(logits(model, ids), native), label
    scheme = hf.apply_scheme(model, "alibi")  # a swap of its own undoes itself too
    scheme.remove()
    assert torch.equal(logits(model, ids), native) and posenc_attributes(model) == []


def test_the_key_changes_with_every_mutation_and_only_then():
    adapted = Adaptation(llama())
    native = {L: adapted.key(L) for L in (32, 4 * L0)}
    keys = {}
    for label, apply in every_adaptation():
        apply(adapted)
        keys[label] = adapted.key(4 * L0)
        assert adapted.key(4 * L0) == keys[label]  # a key is a pure function of the state
        if label in ("dynamic", "rerope"):  # equal forwards up to L0 (dynamic) and within the window w = 8 (ReRoPE)
            assert adapted.key(L0 if label == "dynamic" else 8) == Adaptation(llama()).key(
                L0 if label == "dynamic" else 8
            )
    assert len(set(keys.values())) == len(keys), keys  # scheme:rope too: a scheme never shares the native scores
    assert keys["none"] == native[4 * L0]
    adapted.restore()
    assert adapted.key(32) == native[32]
    adapted.weights = "fine-tuned 4 steps"
    assert adapted.key(32) != native[32]  # trained weights never reuse the scores from before


def test_the_keys_are_those_of_the_records_already_stored():
    """The key hashes what ``schedules.signature`` hashed before the Adaptation, so an earlier run's records.jsonl is
    reused."""
    adapted, got = Adaptation(llama()), {}
    for label, apply in [
        ("none", lambda: None),
        ("leaky-rerope", lambda: adapted.set_schedule(extension("leaky-rerope"))),
        ("scheme:alibi", lambda: adapted.set_scheme("alibi")),
    ]:
        apply()
        got[label] = adapted.key(32)
    assert got == {"none": "397c4541401cd3a2", "leaky-rerope": "c89deb133138e9af", "scheme:alibi": "f758449679bac1dd"}


def test_a_swapped_model_is_refused_a_second_swap():
    model = llama()
    hf.apply_scheme(model, "alibi")
    with pytest.raises(PosencError, match="already swapped"):
        hf.apply_scheme(model, "rope")
    with pytest.raises(PosencError, match="already swapped"):
        Adaptation(model)


def test_extend_reuses_the_scores_of_equal_forwards(llama_dir):
    """dynamic NTK at L <= L0 and ReRoPE with w >= L score what none scores: reused; PI and scheme:rope are scored."""
    out = llama_dir / "o"
    argv = [
        "extend",
        "--model",
        str(llama_dir / "tiny"),
        "--corpus",
        str(llama_dir / "corpus.txt"),
        "--out",
        str(out),
        "--schedules",
        "none",
        "dynamic",
        "rerope",
        "pi",
        "--scheme",
        "rope",
        "--lengths",
        "16",
        "32",
        "--passkey-lengths",
    ]
    assert main(argv) == 0
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    ppl = [r for r in records if r["kind"] == "ppl"]
    reused = {(r["adaptation"], r.get("reused_from")) for r in ppl}
    assert reused == {("none", None), ("dynamic", "none"), ("rerope", "none"), ("pi", None), ("scheme:rope", None)}
    none = {(r["length"], r["begin"]): r["nll_sum"] for r in ppl if r["adaptation"] == "none"}
    assert all(r["nll_sum"] == none[r["length"], r["begin"]] for r in ppl if r["adaptation"] in ("dynamic", "rerope"))
    assert main(argv) == 0  # a rerun scores nothing again
    assert len((out / "records.jsonl").read_text().splitlines()) == len(records)


def test_extend_passkey_prompts_get_the_bos_with_bos_prepend(llama_dir):
    """--bos prepend: every passkey prompt starts with BOS (recorded as the trial's policy); a trial an earlier release
    ran under that setting without a BOS (no policy recorded) is run again, not counted."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(llama_dir / "tiny", bos_token="[UNK]")
    tok.save_pretrained(llama_dir / "tiny")
    out = llama_dir / "o"
    argv = [
        "extend",
        "--model",
        str(llama_dir / "tiny"),
        "--corpus",
        str(llama_dir / "corpus.txt"),
        "--out",
        str(out),
        "--schedules",
        "none",
        "--lengths",
        "32",
        "--passkey-lengths",
        "120",
        "--passkey-schedules",
        "none",
        "--bos",
        "prepend",
    ]
    assert main(argv) == 0
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    (trial,) = [r for r in records if r["kind"] == "passkey"]
    from posenc.eval import passkey

    assert trial["bos"] == "prepend"
    assert (
        trial["prompt_tokens"]
        == len(passkey.passkey_prompt(tok, 120, 0.5, trial["passkey"], tok.bos_token_id)[0])
        <= 120
    )
    old = {k: v for k, v in trial.items() if k != "bos"}  # as an earlier release wrote it
    (out / "records.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in records if r["kind"] != "passkey") + json.dumps(old) + "\n"
    )
    assert main(argv) == 0
    again = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines() if '"passkey"' in line]
    assert [r.get("bos") for r in again if r["kind"] == "passkey"] == [None, "prepend"]
    assert re.search(r"^\| none \| [01]/1 \|$", (out / "results.md").read_text(), re.M)  # one trial counted, not two
