"""A sweep of bad inputs: each is one line and exit 2 on the command line (PosencError in Python),
and no earlier result is touched."""

import hashlib
import inspect
import math

import pytest
import torch

import posenc
from posenc import build_model, encodings
from posenc.attention import attention
from posenc.cli.main import main
from posenc.encodings.base import Dims
from posenc.errors import PosencError
from posenc.model import Cache, pad_left, set_method

DIMS = Dims(n_head=2, head_dim=8, d_model=16, vocab_size=256, train_length=16)


def numeric_params():
    """(scheme, parameter) for every float or int constructor parameter of every registered class."""
    out = []
    for name in encodings.names():
        resolved = encodings.parts(name) if len(encodings.layer_pattern(name)) == 1 else []
        if (
            len(resolved) != 1 or resolved[0][0].name != name
        ):  # aliases and compositions share their classes' parameters
            continue
        cls = resolved[0][0]
        for p in inspect.signature(cls.__init__).parameters.values():
            numeric = type(p.default) in (int, float) or any(t in str(p.annotation) for t in ("float", "int"))
            if p.name not in ("self", "dims", *cls.internal) and numeric:
                out.append((name, p.name))
    return out


@pytest.mark.parametrize("scheme,param", numeric_params())
@pytest.mark.parametrize("value", [math.nan, math.inf, -1e9])
def test_every_numeric_scheme_parameter_is_checked(scheme, param, value):
    with pytest.raises(PosencError, match=param.split("_")[0]):
        encodings.get(scheme, DIMS, **{param: value})


def test_the_sweep_covers_the_numeric_parameters():
    found = set(numeric_params())
    assert {
        ("rope", "rope_theta"),
        ("accumulated", "a"),
        ("xpos", "scale_base"),
        ("pope", "base"),
        ("t5", "num_buckets"),
    } <= found


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda q: dict(q=q[..., :0, :], k=q[..., :0, :], v=q[..., :0, :]), "T >= 1"),
        (lambda q: dict(q=q, k=q[..., :3, :], v=q[..., :3, :]), "more queries"),
        (lambda q: dict(q=q, k=q, v=q, phases=torch.zeros(1, 1, 5, 3)), "phases"),
        (lambda q: dict(q=q, k=q, v=q, phases=torch.zeros(1, 1, 6, 8)), "phases"),
    ],
)
def test_attention_core_shape_errors_are_one_line(make, message):
    q = torch.randn(1, 2, 6, 8)
    with pytest.raises(PosencError, match=message):
        attention(**make(q))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 4-step run of the learned absolute table (32 positions), the reference for 'nothing touched'."""
    out = tmp_path_factory.mktemp("bad") / "run"
    assert main(["train", "--scheme", "learned", "--preset", "quick", "--steps", "4", "--out", str(out)]) == 0
    return out


def digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def bad_commands(run):
    train = [
        "train",
        "--preset",
        "quick",
        "--steps",
        "2",
        "--out",
        str(run),
        "--resume",
    ]  # past the "holds a run" check
    return [
        (["generate", str(run.parent / "missing"), "--prompt", "To be"], "does not exist"),
        (["generate", str(run), "--prompt", "To be", "--scheme", "alibi"], "--scheme applies to pretrained models"),
        (
            ["generate", str(run), "--prompt", "To be", "--schedule", "yarn"],
            "rope schedules apply to models whose every layer is one plain RoPE spec; this run's 'learned' is not "
            "plain RoPE",
        ),
        (
            ["generate", str(run), "--prompt", "To be", "--leak", "2"],
            "--leak is a schedule setting: it needs --schedule",
        ),
        (["generate", str(run), "--prompt", ""], "--prompt is empty"),
        (["generate", str(run), "--prompt", "To be", "--max-new-tokens", "-1"], "max_new_tokens must be"),
        (
            ["generate", str(run), "--prompt", "To be", "--max-new-tokens", "10000000000000"],
            "max_new_tokens must be at most 1,048,576 (posenc.model.MAX_NEW_TOKENS), got 10,000,000,000,000",
        ),
        (["generate", str(run), "--prompt", "To be", "--temperature", "nan"], "temperature must be"),
        (["generate", str(run), "--prompt", "To be", "--temperature", "-1"], "temperature must be"),
        (["generate", str(run), "--prompt", "To be", "--top-k", "0"], "top_k must be"),
        (  # past the vocabulary it kept every token without a word (new-user pass eleven)
            ["generate", str(run), "--prompt", "To be", "--top-k", "100000"],
            "top_k 100000 exceeds the vocabulary (256 tokens): it would keep every token",
        ),
        (
            ["generate", str(run), "--prompt", "x" * 30, "--max-new-tokens", "5"],
            "exceed the learned position table of 32",
        ),
        (["generate", str(run), "--prompt", "To be", "--max-new-tokens", "many"], "invalid int value"),
        (["generate", str(run)], "--prompt"),
        (["eval", str(run), "--passkey", "guess"], "invalid choice"),
        ([*train, "--scheme", "rope:rope_theta=nan"], "rope_theta=nan: must be a finite number"),
        ([*train, "--scheme", "acc-rand-qkv:a=0"], "half-width a"),
        ([*train, "--scheme", "xpos:scale_base=inf"], "scale_base"),
        ([*train, "--scheme", "pope:base=nan"], "base"),
        ([*train, "--scheme", "rope:bogus=1"], "bogus"),
        ([*train, "--scheme", "rope+"], "scheme spec 'rope+': the part after '+' is empty"),
        ([*train, "--scheme", "rope:"], "scheme spec 'rope:': empty parameter list after ':'"),
        ([*train, "--scheme", ""], "scheme"),
        ([*train, "--scheme", "rope", "--batch-size", "-1"], "batch_size"),
        (
            [*train, "--scheme", "rope", "--set", "model.mlp_ratio=.inf"],
            "model.mlp_ratio=inf (command line): Input sho",
        ),
        ([*train, "--scheme", "rope", "--set", "train.lr=1e400"], "train.lr=inf (command line): Input should be a fi"),
        (
            [*train, "--scheme", "rope", "--set", "model.mlp_ratio=0.001"],  # trained a 0-wide MLP with exit 0
            "mlp_ratio 0.001 x d_model 64 leaves the MLP no hidden unit",
        ),
        ([*train, "--scheme", "rope", "--tokenizer", "bpe10"], "unknown tokenizer"),
        (["train", "--scheme", "rope", "--preset", "quick", "--out", ""], "argument --out: is empty"),
        (["eval", ""], "argument run_dir: is empty"),
        (["diagnose", " "], "argument run_dir: is empty"),
        (["report", str(run.parent), ""], "argument RUN_DIR: is empty"),
        (["report", str(run.parent), "--readme", ""], "argument --readme: is empty"),
        (["report", str(run.parent), "--trend", " "], "argument --trend: is empty"),  # fell back to the report
        (  # the dry run said it would train; the run refused
            ["train", "--scheme", "rope", "--preset", "quick", "--set", "model.seed=5", "--dry-run"],
            "model.seed is the training seed's (train.seed 0); got 5: set train.seed",
        ),
        (
            ["finetune", "--quick", "--pose-chunks", "3", "--dry-run"],  # accepted, and PoSE stayed off
            "pose_chunks sets PoSE's chunks; PoSE is on only with pose_target",
        ),
        (
            ["report", str(run.parent), "--scoreboard", "--readme", "R.md"],
            "--readme: not allowed with argument --score",
        ),
        (
            [*train, "--scheme", "rope", "--set", "train.lr="],
            "--set train.lr= has no value (null is written train.lr=null)",
        ),
        (["extend", "--quick", "--schedules", "yarn", "yarn", "--dry-run"], "each entry once: yarn repeated"),
        (["extend", "--quick", "--passkey-depths", "0.5", "0.5", "--dry-run"], "each entry once: 0.5 repeated"),
        (["finetune", "--quick", "--eval-lengths", "256", "256", "--dry-run"], "each entry once: 256 repeated"),
        (["finetune", "--quick", "--lora-rank", "0", "--lora-targets", "q_proj", "--dry-run"], "lora_rank 0 trains"),
        (["harness", "--tasks", "niah_single_1", "--lengths", "512", "512", "--out", "x"], "512 repeated"),
        (
            ["eval", str(run), "--rope-schedule", "yarn", "--factor", "4", "--rope-param", "factor=8"],
            "--rope-param factor=8: factor is given twice",
        ),
        (
            ["extend", "--quick", "--dry-run", "--model", str(run.parent / "empty")],
            "holds no config.json (not a Hugging Face model directory)",
        ),
        (["finetune", "--quick", "--dry-run", "--model", str(run)], "is a posenc train run, not a pretrained model"),
        (["extend", "--quick", "--model", str(run)], "is a posenc train run, not a pretrained model"),
        (["generate", "", "--prompt", "To be"], "argument MODEL: is empty"),
        (["generate", str(run), "--prompt-file", ""], "argument --prompt-file: is empty"),
        (["compare", "--preset", str(run.parent / "latin1.yaml"), "--out", str(run.parent)], "is not UTF-8 text"),
    ]


def test_bad_commands_are_one_line_and_touch_nothing(run, capsys):
    (run.parent / "latin1.yaml").write_bytes(b"\xff\xfe\x00bad")
    (run.parent / "empty").mkdir(exist_ok=True)
    before = digest(run)
    for argv, message in bad_commands(run):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's own errors
            code = exc.code
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and message in err, (argv, err)
        assert digest(run) == before, argv


def test_resume_of_a_state_without_its_keys_is_one_line(run, tmp_path, capsys):
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    torch.save({"step": 3}, copy / "state.pt")
    code = main(["train", "--scheme", "learned", "--preset", "quick", "--steps", "6", "--out", str(copy), "--resume"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "state.pt is damaged: no optimizer; use another --out" in err, err


def test_generate_prints_the_models_greedy_continuation(run, capsys):
    from posenc.train.rundir import load_run

    argv = ["generate", str(run), "--prompt", "To be", "--max-new-tokens", "8", "--temperature", "0"]
    assert main([*argv, "--no-separator"]) == 0  # prompt and completion as one text
    model, _, _ = load_run(run)
    ids = model.generate(torch.tensor(list(b"To be")), 8, temperature=0)
    text = bytes(ids.tolist()).decode("utf-8", errors="replace")
    assert capsys.readouterr().out == text + "\n"
    assert main(argv) == 0  # by default a separator line between them
    assert capsys.readouterr().out == f"To be\n----- completion: 8 tokens -----\n{text[len('To be') :]}\n"


def test_a_run_with_a_bad_training_section_is_one_line(tmp_path):
    from posenc.train.rundir import load_run

    (tmp_path / "config.json").write_text('{"model": {}, "train": {"steps": 0}}')
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(PosencError) as err:
        load_run(tmp_path)
    path = tmp_path / "config.json"
    assert str(err.value) == f"invalid train section of {path}: steps: Input should be greater than 0"


def test_model_api_rejects_bad_shapes():
    model = build_model({"encoding": "rope", "n_layer": 1, "n_head": 2, "d_model": 16})
    with pytest.raises(PosencError, match="T >= 1"):
        model(torch.zeros(2, 0, dtype=torch.long))
    with pytest.raises(PosencError, match="tokens must be"):
        model(torch.zeros(5, dtype=torch.long))


def test_ctrl_c_while_the_command_modules_import_is_an_interrupt(monkeypatch, capsys):
    import importlib

    def interrupted(name):
        raise KeyboardInterrupt

    monkeypatch.setattr(importlib, "import_module", interrupted)  # build_parser imports the command modules
    assert main(["list"]) == 130
    out = capsys.readouterr()
    assert out.err == "posenc: interrupted\n" and out.out == ""


def test_ctrl_c_while_torch_imports_is_an_interrupt(monkeypatch, capsys):
    """The console script's entry imports the command (and torch) inside its own handling."""
    import sys

    from posenc.cli import run

    class Interrupting:  # a finder that is reached only when posenc.cli.main is imported afresh
        def find_spec(self, name, path=None, target=None):
            if name == "posenc.cli.main":
                raise KeyboardInterrupt

    monkeypatch.delitem(sys.modules, "posenc.cli.main", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Interrupting(), *sys.meta_path])
    assert run() == 130
    out = capsys.readouterr()
    assert out.err == "posenc: interrupted\n" and out.out == ""


def test_a_preset_file_without_yaml_extension_is_read(tmp_path, monkeypatch, capsys):
    from posenc.config.plan import load_preset
    from posenc.store.presets import SHIPPED

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mypreset").write_text((SHIPPED / "quick.yaml").read_text().replace("name: quick", "name: mine"))
    assert load_preset("./mypreset").name == "mine" and load_preset("mypreset").name == "mine"
    (tmp_path / "quick").write_text("name: stray\n")  # a stray local file does not shadow a shipped name
    assert load_preset("quick").name == "quick"
    (tmp_path / "bad").write_text((SHIPPED / "quick.yaml").read_text() + "bogus: 1\n")
    code = main(["compare", "--preset", "./bad", "--out", str(tmp_path)])
    assert (code, capsys.readouterr().err) == (
        2,
        "posenc: error: invalid preset bad: bogus: Extra inputs are not permitted\n",
    )


def decoded_cache(**config) -> Cache:
    """The Cache of a one-layer model after a step of a batch of 1 (two tokens)."""
    model = build_model({"n_layer": 1, "n_head": 2, "d_model": 16, **config})
    cache = Cache(1)
    model.decode(torch.tensor([[1, 2]]), cache)
    return cache


def tiny() -> posenc.LM:
    """A one-layer RoPE model of width 16 (two heads)."""
    return build_model({"n_layer": 1, "n_head": 2, "d_model": 16})


def streaming(method: str = "sinks:n_sink=2,window=6") -> posenc.LM:
    """``tiny()`` under a bounded method, for ``streaming_nll``."""
    model = tiny()
    set_method(model, method)
    return model


def qkv(dtypes) -> list[torch.Tensor]:
    """q, k, v (1, 4, 6, 16) in ``dtypes``, for ``posenc.attend`` of a scheme prepared at 6 positions, 4 heads."""
    return [t.to(d) for t, d in zip(torch.randn(3, 1, 4, 6, 16), dtypes)]


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: posenc.Attention(64, 0), "n_head must be an integer >= 1, got 0"),
        (
            lambda: posenc.Attention(64, 4, scheme=None),
            "scheme must be a scheme spec (str, see `posenc list`) or an Encoding, got NoneType",
        ),
        (
            lambda: build_model(["rope"]),
            "a model config is a ModelConfig or a dict of its settings (e.g. {'encoding': 'rope'}), got list",
        ),
        (
            lambda: build_model({"d_model": 10, "n_head": 4}),
            "invalid model config: d_model 10 is not divisible by n_head 4",
        ),
        (lambda: build_model({"n_layer": 0}), "invalid model config: n_layer must be an integer > 0, got 0"),
        (lambda: build_model({"n_layer": True}), "invalid model config: n_layer must be an integer > 0, got True"),
        (
            lambda: build_model({"mlp_ratio": math.inf}),  # an OverflowError at the MLP
            "invalid model config: mlp_ratio must be a finite number > 0, got inf",
        ),
        (
            lambda: build_model({"n_layer": 1, "d_model": 16, "n_head": 2})(torch.zeros(1, 4)),  # RuntimeError
            "token ids must be an int64 tensor, got torch.float32",
        ),
        (lambda: build_model({"mlp": "relu"}), "invalid model config: mlp must be one of gelu, swiglu, got 'relu'"),
        (
            lambda: build_model({"n_layer": 1, "bogus": 1}),
            "invalid model config: bogus: not a setting (valid: vocab_size, n_layer, n_head, d_model, mlp, "
            "mlp_ratio, norm, train_length, encoding, encoding_params, attn_block_size, n_kv_head, canon, seed)",
        ),
        (
            lambda: posenc.Attention(64, 4, scheme="acc-token-qk"),
            "scheme 'acc-token-qk': accumulated mode='token' draws a step per token id: it needs vocab_size >= 1 "
            "(Attention(..., vocab_size=V)), got 0",
        ),
        (
            lambda: build_model({"n_layer": 1, "n_head": 2, "d_model": 16}).generate("To be", 2),
            "the prompt must be token ids (a tensor or a list of ints), got str",
        ),
        *[
            (
                lambda n=n: build_model({"n_layer": 4, "n_head": 2, "d_model": 16}).decode(
                    torch.zeros(1, 3, dtype=torch.long), Cache(n)
                ),
                f"the cache has {n} layers, the model 4: use Cache(4)",
            )
            for n in (2, 8)
        ],
        (lambda: posenc.prepare("rope", torch.randn(1, 6, 16), n_head=0), "n_head must be an integer >= 1, got 0"),
        (lambda: posenc.prepare("alibi", torch.randn(1, 6, 16), n_head=-1), "n_head must be an integer >= 1, got -1"),
        (
            lambda: encodings.get("alibi", Dims(n_head=-1, head_dim=8, d_model=16, vocab_size=0, train_length=16)),
            "n_head must be an integer >= 1, got -1",
        ),
        (
            lambda: posenc.prepare("rope", torch.randn(1, 6, 16), n_head=3),
            "d_model 16 does not divide into 3 heads (give head_dim)",
        ),
        (
            lambda: build_model({"n_layer": 1, "n_head": 2, "d_model": 16})(torch.tensor([[1, 300]])),
            "token ids must lie in [0, 256), got [1, 300]",
        ),
        (
            lambda: build_model({"n_layer": 1, "n_head": 2, "d_model": 16}).token_nll(
                torch.tensor([[1, 3]]), torch.tensor([[1, -2]])
            ),
            "target ids must lie in [0, 256), got [-2, 1]",
        ),
        *[
            (  # an IndexError past the table, and a negative id wrapped around it (issue 59)
                lambda ids=ids: posenc.Attention(32, 2, scheme="acc-token-qk", vocab_size=10)(
                    torch.randn(1, 3, 32), tokens=torch.tensor([ids])
                ),
                f"token ids must lie in [0, 10), got [{min(ids)}, {max(ids)}]",
            )
            for ids in ([1, 2, 30], [1, 2, -1])
        ],
        (lambda: encodings.get(None), "a scheme spec is a string (see `posenc list`), got NoneType None"),
        (lambda: encodings.get(5), "a scheme spec is a string (see `posenc list`), got int 5"),
        (lambda: encodings.is_additive(["rope"]), "a scheme spec is a string (see `posenc list`), got list ['rope']"),
        (lambda: encodings.parts(None), "a scheme spec is a string (see `posenc list`), got NoneType None"),
        (
            lambda: encodings.get("rope", "abc"),
            "dims must be a posenc.encodings.Dims (the layer's sizes), got str",
        ),
        (
            lambda: build_model({"n_layer": 1, "n_head": 2, "d_model": 16}).generate(
                torch.tensor([1, 2]), 2, top_k=True
            ),
            "top_k must be an integer >= 1, got True",
        ),
        (
            lambda: posenc.Attention(32, 2, "rope")(torch.randn(1, 3, 32), positions=[0, 1, 2]),
            "positions must be a (3,) int64 tensor for T = 3, got list",
        ),
        (
            lambda: posenc.Attention(32, 2, "rope")(torch.randn(1, 3, 32), cache={}),
            "cache must be a posenc.LayerCache (one per layer), got dict",
        ),
        (
            lambda: posenc.Attention(32, 2, "rope").decode(torch.randn(1, 3, 32), Cache(1)),
            "cache must be a posenc.LayerCache (one per layer), got Cache",
        ),
        # accepted before (issue 59): n_kv_head 0 taken for None, caches of no layers or a negative capacity, a
        # reorder row outside a batch of 1 (kept unseen), a pattern's entry another layer takes
        (lambda: posenc.Attention(32, 4, n_kv_head=0), "n_kv_head must be an integer >= 1, got 0"),
        *[
            (lambda n=n: Cache(n), f"a Cache's n_layer must be an integer >= 1 (the model's layers), got {n}")
            for n in (-1, 0)
        ],
        (lambda: Cache(1, capacity=-1), "capacity must be an integer >= 0 (positions to reserve), got -1"),
        (lambda: posenc.LayerCache(capacity=-1), "capacity must be an integer >= 0 (positions to reserve), got -1"),
        *[
            (
                lambda rows=rows: decoded_cache().reorder(torch.tensor(rows)),
                f"reorder index rows must lie in [0, 1) (the cached batch), got [{min(rows)}, {max(rows)}]",
            )
            for rows in ([5], [0, -1])
        ],
        (lambda: decoded_cache().reorder([0]), "a reorder index must be a (rows,) int64 tensor, got list"),
        *[  # -1 said "a model with a Canon layer cannot crop" of a model without one (issue 59)
            (
                lambda n=n: decoded_cache().crop(n),
                f"cannot crop a cache of 2 positions to {n}: the length kept must be an integer in [0, 2]",
            )
            for n in (-1, 3)
        ],
        (
            lambda: encodings.get("gemma3:factor=0"),
            "scheme 'gemma3:factor=0': rope: factor must be a number >= 1 (positions / factor), got 0",
        ),
        (
            lambda: encodings.get("rope|rope:rope_theta=-1"),
            "scheme 'rope:rope_theta=-1': rope_theta must be a finite number > 1, got -1",
        ),
        # accepted before (issue 59): a negative pad id, a temperature that is no number (a raw TypeError from
        # math.isfinite) or a bool, a size past 2^31 (said "not divisible" by the heads, or taken)
        (lambda: pad_left([[1, 2], [3]], pad_id=-1), "pad_id must be an integer in [0, 2^63) (a token id), got -1"),
        *[
            (
                lambda t=t: build_model({"n_layer": 1, "n_head": 2, "d_model": 16}).generate([1, 2], 2, temperature=t),
                f"temperature must be a number (0: greedy), got {type(t).__name__} {t!r}",
            )
            for t in ("hot", None, True)
        ],
        *[
            (
                lambda d=d: build_model({"d_model": d, "n_head": 3}),
                f"invalid model config: d_model must be an integer below 2^31 (a size), got {d}",
            )
            for d in (10**23, 2**31)
        ],
        # raw errors from deep inside torch before (issue 59, api pass): a seed of another type (a TypeError, a
        # RuntimeError from manual_seed), ids the embedding cannot take, a pad id past int64 (an OverflowError) and
        # prompts pad_left silently truncated (floats), flattened (2-D) or took (negative ids), Attention sizes that
        # are no integers (a TypeError, a ValueError from range or torch.cat), an int or float64 x, attend over
        # other positions (a RuntimeError from expand) or without prepared hooks, specs, caches and configs of
        # another type (a TypeError or AttributeError), an empty reorder index (a cache of batch size 0)
        *[
            (
                lambda s=s: build_model({"n_layer": 1, "n_head": 2, "d_model": 16}).generate([1, 2], 2, seed=s),
                f"seed must be an integer in [0, 2^64) (a torch generator's) or None, got {s!r}",
            )
            for s in ("a", 1.5, True, -1)
        ],
        *[
            (
                lambda d=d: build_model({"n_layer": 1, "n_head": 2, "d_model": 16}).generate(
                    torch.tensor([1, 2], dtype=d), 2
                ),
                f"prompt token ids must be an int64 tensor, got {d}",
            )
            for d in (torch.uint8, torch.int32, torch.float32)
        ],
        (
            lambda: build_model({"n_layer": 1, "n_head": 2, "d_model": 16})(torch.ones(1, 2, dtype=torch.uint8)),
            "token ids must be an int64 tensor, got torch.uint8",
        ),
        (
            lambda: build_model({"n_layer": 1, "n_head": 2, "d_model": 16}).decode(
                torch.ones(1, 2, dtype=torch.int16), Cache(1)
            ),
            "token ids must be an int64 tensor, got torch.int16",
        ),
        *[
            (
                lambda p=p: pad_left([[1, 2], [3]], pad_id=p),
                f"pad_id must be an integer in [0, 2^63) (a token id), got {p}",
            )
            for p in (10**30, 2**63)
        ],
        (lambda: pad_left([[1.5, 2.7]]), "prompt 0's token ids must be an int64 tensor, got torch.float32"),
        (
            lambda: pad_left([[1], [[1, 2], [3, 4]]]),
            "each prompt must be a (T,) list or tensor of token ids; prompt 1 has shape (2, 2)",
        ),
        (lambda: pad_left([1, 2]), "each prompt must be a (T,) list or tensor of token ids; prompt 0 has shape ()"),
        (lambda: pad_left([[3], [-5, 2]]), "prompt 1's token ids must be >= 0, got [-5, 2]"),
        *[(lambda d=d: posenc.Attention(d, 4), f"d_model must be an integer >= 1, got {d!r}") for d in ("64", 64.0)],
        *[
            (lambda b=b: posenc.Attention(64, 4, "alibi", block_size=b), f"block_size must be an integer >= 1, got {b}")
            for b in (0, -1)
        ],
        (
            lambda: posenc.Attention(64, 4, "rope", params=[1]),
            "params must be a dict of the scheme's parameters, got list",
        ),
        (
            lambda: posenc.Attention(32, 2, "rope")(torch.ones(1, 3, 32, dtype=torch.long)),
            "x must be a floating tensor, got torch.int64",
        ),
        *[
            (
                lambda c=c: posenc.Attention(32, 2, "rope")(torch.randn(1, 3, 32, dtype=torch.float64), cache=c),
                "x is torch.float64 but the layer's weights are torch.float32: cast x (x.to) or the layer (.to)",
            )
            for c in (None, posenc.LayerCache())
        ],
        (
            lambda: posenc.attend(
                *torch.randn(3, 1, 4, 5, 16), posenc.prepare("alibi", torch.randn(1, 4, 64), n_head=4)
            ),
            "the scheme was prepared at 4 positions; got k, v of 5 and q of 5 (k, v need all 4, q at most 4)",
        ),
        (
            lambda: posenc.attend(*torch.randn(3, 1, 4, 4, 16), None),
            "prepared must be a posenc.Prepared (posenc.prepare's), got NoneType",
        ),
        (
            lambda: set_method(build_model({"n_layer": 1, "n_head": 2, "d_model": 16}), 123),
            "a method spec is a string, got int 123",
        ),
        (
            lambda: build_model({"n_layer": 1, "n_head": 2, "d_model": 16}).decode(torch.tensor([[1, 2]]), "x"),
            "cache must be a posenc.model.Cache (one per model), got str",
        ),
        (
            lambda: posenc.LM("rope"),
            "LM takes a ModelConfig (build_model takes a dict of its settings too), got str",
        ),
        (
            lambda: decoded_cache().reorder(torch.tensor([], dtype=torch.long)),
            "a reorder index must select at least one row, got none",
        ),
        (
            lambda: posenc.LayerCache().reorder(torch.tensor([], dtype=torch.long)),
            "a reorder index must select at least one row, got none",
        ),
        # new-user pass nine, the Python API (issue 59): a batch of 0 rows (a raw RuntimeError from a reshape), a list
        # of ids where forward and decode take a tensor, set_method's arguments swapped (AttributeError), a chunk
        # that is no integer (a TypeError from range; True taken for 1), q, k, v of two dtypes (silently cast under
        # a rotation, a raw RuntimeError from the kernel under a bias), heads that do not divide d_model said to be
        # n_kv_head's, and per-token-id steps given ids of another shape (a raw RuntimeError, or "phases do not fit")
        (
            lambda: tiny()(torch.zeros(0, 4, dtype=torch.long)),
            "tokens must be (batch, T) with batch >= 1 and T >= 1, got shape (0, 4)",
        ),
        (
            lambda: tiny().token_nll(torch.zeros(0, 4, dtype=torch.long), torch.zeros(0, 4, dtype=torch.long)),
            "tokens must be (batch, T) with batch >= 1 and T >= 1, got shape (0, 4)",
        ),
        (
            lambda: tiny().decode(torch.zeros(0, 4, dtype=torch.long), Cache(1)),
            "tokens must be (batch, n) with batch >= 1 and n >= 1, got shape (0, 4)",
        ),
        (
            lambda: tiny().generate(torch.zeros(0, 4, dtype=torch.long), 2),
            "the prompt must be (T,) or (batch, T) token ids, batch >= 1 and T >= 1; got shape (0, 4)",
        ),
        (
            lambda: posenc.Attention(32, 2, "rope")(torch.randn(0, 3, 32)),
            "x must be (batch, T, 32) with batch >= 1 and T >= 1, got shape (0, 3, 32)",
        ),
        (
            lambda: posenc.Attention(32, 2, "rope").decode(torch.randn(0, 3, 32), posenc.LayerCache()),
            "x must be (batch, T, 32) with batch >= 1 and T >= 1, got shape (0, 3, 32)",
        ),
        (
            lambda: tiny()([[1, 2, 3]]),
            "tokens must be a (batch, T) int64 tensor (torch.tensor(ids); generate takes a list too), got list",
        ),
        (
            lambda: tiny()([[1, 2, 3]], attention_mask=torch.ones(1, 3)),
            "tokens must be a (batch, T) int64 tensor (torch.tensor(ids); generate takes a list too), got list",
        ),
        (
            lambda: tiny().decode([[1, 2, 3]], Cache(1)),
            "tokens must be a (batch, n) int64 tensor (torch.tensor(ids); generate takes a list too), got list",
        ),
        (
            lambda: set_method("self-extend", tiny()),
            "set_method(model, spec) takes a posenc.LM first, got str 'self-extend' (the method spec comes second)",
        ),
        (
            lambda: set_method(posenc.Attention(16, 2), "self-extend"),
            "set_method(model, spec) takes a posenc.LM first, got Attention",
        ),
        *[
            (
                lambda c=c: streaming().streaming_nll(torch.arange(8), chunk=c),
                f"chunk must be an integer >= 1, got {c!r}",
            )
            for c in (2.5, True, "3", 0)
        ],
        (
            lambda: streaming().streaming_nll([1, 2, 3]),
            "streaming needs a (T,) tensor of token ids, T >= 2, got list",
        ),
        (
            lambda: streaming().streaming_nll(torch.tensor([1])),
            "streaming needs a (T,) tensor of token ids, T >= 2, got shape (1,)",
        ),
        *[
            (
                lambda s=s, d=d: posenc.attend(*qkv(d), posenc.prepare(s, torch.randn(1, 6, 64), n_head=4)),
                "q, k, v must share one dtype, got " + ", ".join(map(str, d)) + ": cast them (.to) to one",
            )
            for s in ("rope", "alibi")
            for d in (
                (torch.float64, torch.float32, torch.float32),
                (torch.float32, torch.float32, torch.float64),
            )
        ],
        (lambda: posenc.Attention(32, 3), "d_model 32 is not divisible by n_head 3"),
        (lambda: posenc.Attention(32, 4, n_kv_head=3), "n_head 4 is not divisible by n_kv_head 3"),
        *[
            (
                lambda b=b, t=t: posenc.Attention(32, 2, scheme="acc-token-qk", vocab_size=10)(
                    torch.randn(b, 3, 32), tokens=torch.ones(t, dtype=torch.long)
                ),
                f"token ids must be (batch, T) = ({b}, 3), x's, got shape {t}",
            )
            for b, t in ((1, (3,)), (1, (1, 2)), (1, (1, 1, 3)), (1, (2, 3)), (2, (1, 3)))
        ],
        # new-user pass ten, the Python API (issue 59): prepare of a scheme that is no spec (an AttributeError),
        # attend over int q, k, v (a raw RuntimeError from the kernel) or lists (AttributeError), a block_size that
        # is no integer >= 1 (a raw error under a bias, silently taken under a rotation), Attention.set_method of a
        # spec string (stored, then an AttributeError at the forward) and prepare's head_dim=0 (taken for None)
        (
            lambda: posenc.prepare(5, torch.randn(1, 6, 16), n_head=2),
            "scheme must be a scheme spec (str, see `posenc list`) or an Encoding, got int",
        ),
        *[
            (
                lambda s=s: posenc.attend(*qkv([torch.long] * 3), posenc.prepare(s, torch.randn(1, 6, 64), n_head=4)),
                "q, k, v must be floating tensors, got torch.int64, torch.int64, torch.int64",
            )
            for s in ("rope", "alibi")
        ],
        (
            lambda: posenc.attend([1], [1], [1], posenc.prepare("rope", torch.randn(1, 6, 64), n_head=4)),
            "q, k, v must be floating tensors, got list, list, list",
        ),
        *[
            (
                lambda s=s, b=b: posenc.attend(
                    *qkv([torch.float32] * 3), posenc.prepare(s, torch.randn(1, 6, 64), n_head=4), block_size=b
                ),
                f"block_size must be an integer >= 1, got {b!r}",
            )
            for s in ("rope", "alibi")
            for b in (0, -1, 2.5, True)
        ],
        (
            lambda: posenc.Attention(16, 2, "rope", train_length=8).set_method(5),
            "a method spec is a string, got int 5",
        ),
        (
            lambda: posenc.Attention(16, 2, "rope", train_length=8).set_method("sinks:n_sink=2,window=40"),
            "method sinks: n_sink + window = 42 passes the trained length 8; the method keeps exact positions up to "
            "it (give a smaller one)",
        ),
        (
            lambda: posenc.Attention(16, 2, "nope").set_method("lm-infinite"),
            "method lm-infinite applies to rope (fixed-frequency schedules), alibi, t5 and kerple; this layer uses "
            "nope",
        ),
        (
            lambda: posenc.prepare("rope", torch.randn(1, 6, 16), n_head=2, head_dim=0),
            "head_dim must be an integer >= 1, got 0",
        ),
    ],
)
def test_python_api_bad_arguments_are_one_line(make, message):
    with pytest.raises(PosencError) as err:
        make()
    assert str(err.value) == message


def test_max_new_tokens_is_bounded_before_any_token_is_generated():
    """10^13 new tokens ran until killed; the cap is refused in one line, and the cap itself is accepted."""
    from posenc.model import MAX_NEW_TOKENS, check_sampling

    assert MAX_NEW_TOKENS == 1_048_576
    check_sampling(MAX_NEW_TOKENS, 1.0, None)
    model = build_model({"encoding": "rope", "n_layer": 1, "n_head": 2, "d_model": 16})
    for n in (MAX_NEW_TOKENS + 1, 10**13):
        with pytest.raises(PosencError, match=f"^max_new_tokens must be at most 1,048,576 .*, got {n:,}$"):
            model.generate(torch.tensor([1, 2]), n)


def test_generate_takes_a_list_of_token_ids():
    model = build_model({"encoding": "rope", "n_layer": 1, "n_head": 2, "d_model": 16})
    ids = model.generate([84, 111, 32], 4, temperature=0)
    assert torch.equal(ids, model.generate(torch.tensor([84, 111, 32]), 4, temperature=0)) and ids.shape == (7,)


def test_bugs_inside_a_scheme_raise_with_their_traceback_and_bad_values_are_one_line_errors():
    """A mistyped attribute inside a scheme is a bug (AttributeError, traceback), not 'invalid parameters'."""
    from posenc import encodings
    from posenc.encodings.base import Encoding
    from posenc.errors import PosencError

    @encodings.register
    class Broken(Encoding):
        name = "broken-plugin"

        def __init__(self, dims, width: int = 2):
            super().__init__(dims)
            self.width = self.widht  # the bug

    try:
        with pytest.raises(AttributeError, match="widht"):
            encodings.get("broken-plugin")
        with pytest.raises(PosencError, match="width='x': expected int"):  # a bad value is still the user's
            encodings.get("broken-plugin:width=x")
    finally:
        encodings.unregister("broken-plugin")
    for params, message in (
        ({"schedule": "yarn", "schedule_params": 5}, "expected dict"),
        ({"schedule": "yarn", "schedule_params": {"factor": "x"}}, "factor='x': expected a finite number"),
        ({"schedule_params": {"factor": 2.0}}, "need a schedule"),
    ):
        with pytest.raises(PosencError, match=message):
            encodings.get("rope", **params)


def test_decode_with_an_id_outside_the_vocabulary_is_a_one_line_error():
    from posenc.errors import PosencError
    from posenc.model import Cache

    model = build_model({"encoding": "rope", "n_layer": 1, "n_head": 2, "d_model": 32, "vocab_size": 50})
    for bad in (50, -1):
        with pytest.raises(PosencError, match=r"token ids must lie in \[0, 50\)"):
            model.decode(torch.tensor([[1, bad]]), Cache(1))


def test_xpos_refuses_decreasing_positions():
    """Decreasing position ids gave NaN: the decay factor grows without bound for keys after their query."""
    from posenc.errors import PosencError

    model = build_model({"encoding": "xpos", "n_layer": 1, "n_head": 2, "d_model": 32})
    tokens = torch.randint(0, 256, (1, 10))
    assert torch.isfinite(model.hidden(tokens, torch.arange(10) * 3)).all()  # gaps are fine
    with pytest.raises(PosencError, match="xpos needs non-decreasing position ids"):
        model.hidden(tokens, torch.arange(10).flip(0))


@pytest.mark.parametrize("scheme", ["learned", "sinusoidal", "fire", "rope", "alibi"])
@pytest.mark.parametrize(
    "pos, message",
    [
        (torch.tensor([-3, -2, -1]), "positions must be >= 0 (absolute positions count from 0), got -3"),
        (torch.tensor([0.5, 1.5, 2.5]), "positions must be (3,) int64 for T = 3, got shape (3,) torch.float32"),
    ],
)
def test_negative_or_float_positions_are_refused_for_every_scheme(scheme, pos, message):
    """Issue 59: learned raised a raw IndexError (negative) or RuntimeError (float) from its table; sinusoidal, FIRE
    and the others gave a value of no position. One check (``check_pos``) wherever positions enter."""
    model = build_model({"encoding": scheme, "n_layer": 1, "n_head": 2, "d_model": 16, "train_length": 16})
    with pytest.raises(PosencError) as err:
        model(torch.zeros(1, 3, dtype=torch.int64), pos)
    assert str(err.value) == message
    if not encodings.is_additive(scheme):
        with pytest.raises(PosencError) as err:
            posenc.Attention(16, 2, scheme)(torch.randn(1, 3, 16), pos)
        assert str(err.value) == message


def test_a_learned_table_refuses_positions_it_has_no_row_for():
    """Issue 59: its lookup raised torch's IndexError (negative) or RuntimeError (float)."""
    from posenc.encodings.absolute import LengthNotSupported

    enc = encodings.get("learned", DIMS)
    with pytest.raises(PosencError, match=r"^positions must be >= 0 \(absolute positions count from 0\), got -1$"):
        enc.embed(torch.tensor([-1, 0]))
    with pytest.raises(PosencError, match=r"^positions must be int64, got shape \(2,\) torch.float32$"):
        enc.embed(torch.tensor([0.0, 1.0]))
    with pytest.raises(LengthNotSupported, match=r"^learned positions cover 16 tokens, got 17$"):
        enc.embed(torch.tensor([0, 16]))
