"""posenc extend's configuration: shipped YAML presets, bad presets as one-line errors, flags over presets."""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
from pathlib import Path

import pytest

from posenc.cli import extend_cmd
from posenc.cli.main import build_parser, main
from posenc.errors import PosencError
from posenc.eval.perplexity import bucket_width
from posenc.hf.schedules import Extension
from posenc.jobs.extend import ExtendConfig, extension, load_extend_config, open_store, preset_names
from posenc.rope import NAMES
from posenc.store.records import ScoredWindow, append

REPO = Path(__file__).resolve().parents[2]
# the presets of the command before they became YAML files
SHIPPED = {
    "default": dict(
        lengths=[8192, 16384, 32768],
        long_schedules=["dynamic"],
        max_windows=1,
        passkey_lengths=[8192],
        passkey_depths=[0.5],
        passkey_schedules=["none", "yarn"],
    ),
    "quick": dict(
        lengths=[512, 1024],
        long_schedules=None,
        max_windows=1,
        passkey_lengths=[1024],
        passkey_depths=[0.5],
        passkey_schedules=["none", "yarn"],
    ),
    "reproduce": dict(
        lengths=[1024, 2048, 4096, 8192, 16384, 32768],
        long_schedules=None,
        max_windows=0,
        passkey_lengths=[],
        passkey_depths=[0.5],
        passkey_schedules=None,
    ),
}
COMMON = dict(
    model="smollm2",
    corpus="shakespeare",
    docs=["first"],
    max_tokens=32768,
    factor=2.0,
    stride=None,
    bos="none",
    bucket=None,
    rerope_window=None,
    leak=None,
    seed=0,
    schedules=list(NAMES),
    schemes=[],
    methods=[],
    stream=0,
    trials=1,
    threads=None,
    dtype="float32",
    original_max_position_embeddings=None,
    attention_factor=None,
    beta_fast=None,
    beta_slow=None,
    truncate=None,
    low_freq_factor=None,
    high_freq_factor=None,
    short_factor=None,
    long_factor=None,
    mscale=None,
    mscale_all_dim=None,
)


def parse(*argv: str) -> ExtendConfig:
    return extend_cmd.config(build_parser().parse_args(["extend", *argv]))


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_presets_load(name):
    assert preset_names() == sorted(SHIPPED)
    cfg = load_extend_config(name)
    assert cfg.model_dump() == {"name": name, **COMMON, **SHIPPED[name]}
    assert parse(f"--{name}" if name != "default" else "--preset=default") == cfg  # --quick, --reproduce: shorthands


def test_package_data_ships_every_preset():
    tomllib = pytest.importorskip("tomllib")
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["posenc"]
    src = REPO / "src" / "posenc"
    shipped = [p.relative_to(src).as_posix() for p in (src / "presets").rglob("*.yaml")]
    assert "presets/extend/quick.yaml" in shipped
    assert all(any(fnmatch.fnmatch(p, g) and p.count("/") == g.count("/") for g in globs) for p in shipped)


def test_flags_override_the_preset(tmp_path):
    cfg = parse(
        "--quick",
        "--lengths",
        "64",
        "128",
        "--factor",
        "4",
        "--long-schedules",
        "--passkey-lengths",
        "--schedules",
        "none",
        "yarn",
        "--name",
        "mine",
        "--stride",
        "9",
    )
    assert (cfg.lengths, cfg.factor, cfg.long_schedules, cfg.passkey_lengths) == ([64, 128], 4.0, None, [])
    assert (cfg.schedules, cfg.name, cfg.stride) == (["none", "yarn"], "mine", 9)
    assert (cfg.max_windows, cfg.passkey_schedules, cfg.bucket) == (1, ["none", "yarn"], None)  # the rest: quick's
    assert parse("--quick", "--bucket", "64").bucket == 64
    assert parse("--long-schedules", "yarn").long_schedules == ["yarn"] and parse().long_schedules == ["dynamic"]
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\nlengths: [16, 32]\nfactor: 2\nbos: prepend\n")
    cfg = parse("--preset", str(path), "--bos", "none")
    assert (cfg.name, cfg.lengths, cfg.bos) == ("mine", [16, 32], "none")
    assert type(cfg.factor) is float  # YAML 2 and --factor 2 give one setting tag (2.0 in its JSON)
    with pytest.raises(SystemExit):  # one preset at a time
        build_parser().parse_args(["extend", "--quick", "--preset", "default"])


@pytest.mark.parametrize(
    "text,message",
    [
        (
            "name: x\nlengths: [16]\nlenghts: [32]\n",
            "invalid extend preset bad.yaml: lenghts: Extra inputs are not permitted",
        ),
        (
            "name: x\nlengths: [16]\nfactor: 0.5\n",
            "invalid extend preset bad.yaml: factor: Input should be greater than or equal to 1",
        ),
        (
            "name: x\nlengths: [1]\n",
            "invalid extend preset bad.yaml: lengths.0: Input should be greater than or equal to 2",
        ),
        ("name: x\n", "invalid extend preset bad.yaml: lengths: Field required"),
        ("name: x\nlengths: [16]\nschedules: [leaky_rerope]\n", "unknown rope schedule 'leaky_rerope'"),
        ("name: x\nlengths: [16]\nmethods: [nosuch+self-extend]\n", "unknown rope schedule 'nosuch'"),
        (
            "name: x\nlengths: [16]\nmethods: [dynamic+self-extend]\n",
            "a method goes on native RoPE or a fixed-frequency",
        ),
        ("name: x\nlengths: [16]\nmethods: [self-extend:group=0]\n", "group must be an integer in [1, "),
        ("name: x\nlengths: [16]\nmethods: [sinks:window=0]\n", "window must be an integer in [1, "),
        ("name: x\nlengths: [16]\npasskey_methods: [yarn]\n", "passkey_methods: Extra inputs are not permitted"),
        ("name: x\nlengths: [16, 32]\nstride: 16\n", "--stride must be in [1, 15]"),
        ("name: [x\n", "is not valid YAML"),
        ("- name\n", "is not a YAML mapping"),
    ],
)
def test_bad_preset_is_one_line_error(tmp_path, text, message):
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(PosencError) as err:
        load_extend_config(str(tmp_path / "bad.yaml"))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_cli_bad_preset_or_flag_exits_2(tmp_path, capsys):
    out = tmp_path / "o"
    for argv, message in (
        (["--preset", "nosuch"], "unknown extend preset 'nosuch'; valid: default, quick, reproduce"),
        (["--factor", "0.5"], "invalid factor=0.5 (command line): Input should be greater than or equal to 1"),
        (["--method", "ntk+nosuch"], "unknown method 'nosuch'"),
        (["--schedules", "nosuch"], "unknown rope schedule 'nosuch'"),
    ):
        assert main(["extend", *argv, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err
    assert not out.exists()


def test_scheme_flag_is_validated_before_any_work():
    assert parse("--quick", "--scheme", "alibi", "rope:rope_theta=5").schemes == ["alibi", "rope:rope_theta=5"]
    for spec, message in (
        ("nosuch", "unknown scheme 'nosuch'"),
        ("alibi:x=1", "has no parameter 'x'"),
        ("rope||nope", "empty layer entry"),
    ):
        with pytest.raises(PosencError, match=message):
            parse("--quick", "--scheme", spec)


def _extend_help() -> str:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["extend"].format_help()


def test_help_reads_preset_values_and_the_rerope_default():
    """The help's lengths are the quick and reproduce presets', the ReRoPE window the one schedules uses (L0 // 4)."""
    from posenc.hf.schedules import WINDOW_DIVISOR

    text = " ".join(_extend_help().split())
    assert WINDOW_DIVISOR == 4 and "ReRoPE window w in tokens (default L0/4)" in text
    assert load_extend_config("reproduce").lengths == [1024, 2048, 4096, 8192, 16384, 32768]
    assert (
        "--preset reproduce: every window, 1K..32K (hours)" in text
        and "every non-overlapping window, 1K..32K, all schedules" in text
    )
    assert "512 and 1K tokens, passkey at 1K: a smoke test" in text
    quick, reproduce = load_extend_config("quick"), load_extend_config("reproduce")
    other = extend_cmd.budget_note(
        quick.model_copy(update={"lengths": [256, 2048], "passkey_lengths": [2048]}),
        reproduce.model_copy(update={"lengths": [4096, 65536]}),
    )
    assert "4K..64K" in other and "256 and 2K tokens, passkey at\n2K" in other  # read from the configs, not written in


SETTINGS = (
    "--original-max-position-embeddings",
    "32768",
    "--attention-factor",
    "1.0",
    "--beta-fast",
    "16",
    "--beta-slow",
    "2",
    "--no-truncate",
    "--short-factor",
    "1,1.5",
    "--long-factor",
    "2,3.5",
    "--rerope-window",
    "64",
)
KEYS = (
    "original_max_position_embeddings: 32768\nattention_factor: 1.0\nbeta_fast: 16\nbeta_slow: 2\ntruncate: false\n"
    "short_factor: [1, 1.5]\nlong_factor: [2, 3.5]\nrerope_window: 64\n"
)


def test_every_schedule_setting_is_a_flag_and_a_preset_key(tmp_path):
    """Each schedule of the run gets the settings it takes: yarn its betas, truncate and attention factor, longrope
    its lists and attention factor, rerope its window; L0 goes to every schedule."""
    cfg = parse("--quick", "--schedules", "yarn", "longrope", "pi", "rerope", *SETTINGS)
    l0 = {"original_max_position_embeddings": 32768}
    assert extension(cfg, "yarn") == Extension(
        "yarn", 2.0, attention_factor=1.0, beta_fast=16.0, beta_slow=2.0, truncate=False, **l0
    )
    assert extension(cfg, "longrope") == Extension(
        "longrope", 2.0, short_factor=(1.0, 1.5), long_factor=(2.0, 3.5), attention_factor=1.0, **l0
    )
    assert extension(cfg, "pi") == Extension("pi", 2.0, **l0)
    assert extension(cfg, "rerope") == Extension("rerope", 2.0, window=64, **l0)
    path = tmp_path / "mine.yaml"
    path.write_text(
        "name: quick\nlengths: [512, 1024]\nmax_windows: 1\npasskey_lengths: [1024]\n"
        "passkey_schedules: [none, yarn]\nschedules: [yarn, longrope, pi, rerope]\n" + KEYS
    )
    assert load_extend_config(str(path)) == cfg
    assert parse("--quick", "--schedules", "yarn", "--truncate").truncate is True


def test_the_schedule_settings_enter_the_setting_tag_only_when_given(tmp_path):
    """A setting changes the tag (its records are not another setting's); without one the tag is the earlier
    releases'."""
    docs = [("doc", [])]
    (tmp_path / "o").mkdir()

    def tag(*argv):
        return open_store(tmp_path / "o", parse("--quick", "--schedules", "yarn", *argv), docs, 256, "src").tag

    cfg = parse("--quick", "--schedules", "yarn")
    old = {
        k: getattr(cfg, k)
        for k in (
            "model",
            "corpus",
            "docs",
            "factor",
            "max_tokens",
            "stride",
            "bos",
            "bucket",
            "rerope_window",
            "leak",
            "seed",
        )
    } | {"docs": ["doc"]}
    assert tag() == hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()[:12]
    tags = {
        tag(),
        tag("--beta-fast", "16"),
        tag("--beta-fast", "8"),
        tag("--no-truncate"),
        tag("--attention-factor", "1"),
        tag("--original-max-position-embeddings", "128"),
    }
    assert len(tags) == 6


def test_bucket_width_is_one_32nd_of_the_length_unless_given():
    assert [bucket_width(L) for L in (2, 31, 32, 64, 512, 1000, 8192, 32768)] == [1, 1, 1, 2, 16, 16, 256, 1024]
    assert bucket_width(512, 1024) == 1024 and bucket_width(8192, 7) == 7


def test_a_run_directory_keeps_its_recorded_bucket_width(tmp_path):
    """Without --bucket a new directory scores 1/32 of each length, one an earlier release ran (config.json: bucket
    1024, its default then) keeps 1024: the tag is that run's, so its finished records are read and it resumes."""
    docs = [("doc", [])]
    new, old = tmp_path / "new", tmp_path / "old"
    new.mkdir()
    old.mkdir()
    cfg = parse("--quick", "--schedules", "yarn")
    setting = {
        k: getattr(cfg, k)
        for k in (
            "model",
            "corpus",
            "docs",
            "factor",
            "max_tokens",
            "stride",
            "bos",
            "bucket",
            "rerope_window",
            "leak",
            "seed",
        )
    } | {"docs": ["doc"]}
    (old / "config.json").write_text(json.dumps({**setting, "bucket": 1024, "native_context": 256, "invocations": []}))
    earlier = hashlib.sha256(json.dumps({**setting, "bucket": 1024}, sort_keys=True).encode()).hexdigest()[:12]
    append(
        old / "records.jsonl",
        ScoredWindow(
            key="ppl|yarn|512|doc|0",
            adaptation="yarn",
            factor=2.0,
            length=512,
            stride=511,
            bos="none",
            doc="doc",
            begin=0,
            bucket=1024,
            signature="s",
            seconds=1.0,
            nll_sum=5.0,
            n_scored=511,
            bucket_nll=[5.0],
            bucket_n=[511],
            setting=earlier,
        ),
    )
    store = open_store(old, cfg, docs, 256, "src")
    assert (store.tag, store.bucket, store.done) == (earlier, 1024, {"ppl|yarn|512|doc|0"})
    assert json.loads((old / "config.json").read_text())["bucket"] == 1024
    store = open_store(new, cfg, docs, 256, "src")
    assert (
        store.bucket is None
        and store.tag == hashlib.sha256(json.dumps(setting, sort_keys=True).encode()).hexdigest()[:12]
    )
    assert (
        open_store(old, parse("--quick", "--schedules", "yarn", "--bucket", "64"), docs, 256, "src").bucket == 64
    )  # given: its own


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["--schedules", "pi", "--beta-fast", "16"],
            "beta_fast (--beta-fast) is a setting of yarn; no schedule of this run (pi) takes it",
        ),
        (
            ["--schedules", "none", "ntk", "--short-factor", "1,2"],
            "short_factor (--short-factor) is a setting of longrope; no schedule",
        ),
        (
            ["--schedules", "yarn", "--rerope-window", "8"],
            "rerope_window (--rerope-window) is a setting of rerope, leaky-rerope;",
        ),
        (
            ["--schedules", "longrope", "--short-factor", "1,x", "--long-factor", "1"],
            "--short-factor takes comma-separated numbers, got '1,x'",
        ),
        (
            ["--schedules", "longrope", "--short-factor", "1,nan", "--long-factor", "1"],
            "--short-factor takes finite numbers",
        ),
        (
            ["--schedules", "yarn", "--attention-factor", "0"],
            "attention_factor=0.0 (command line): Input should be greater than 0",
        ),
        (
            ["--schedules", "yarn", "--original-max-position-embeddings", "1"],
            "original_max_position_embeddings=1 (command line): Input should be greater",
        ),
    ],
)
def test_a_schedule_setting_no_schedule_takes_or_out_of_range_exits_2(tmp_path, capsys, argv, message):
    out = tmp_path / "o"
    assert main(["extend", "--quick", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert not out.exists()


def test_finetune_takes_the_same_schedule_settings():
    from posenc.cli import finetune_cmd

    def ft(*argv):
        return finetune_cmd.config(build_parser().parse_args(["finetune", *argv]))

    cfg = ft("--schedule", "yarn", "--beta-fast", "16", "--no-truncate", "--original-max-position-embeddings", "128")
    assert extension(cfg, cfg.schedule) == Extension(
        "yarn", cfg.factor, beta_fast=16.0, truncate=False, original_max_position_embeddings=128
    )
    cfg = ft("--schedule", "longrope", "--short-factor", "1,2", "--long-factor", "3,4")
    assert (cfg.short_factor, cfg.long_factor) == ([1.0, 2.0], [3.0, 4.0])
    with pytest.raises(
        PosencError,
        match=r"^beta_fast \(--beta-fast\) is a setting of yarn; no schedule of this run \(none\) takes it$",
    ):
        ft("--scheme", "alibi", "--beta-fast", "16")


def test_every_schedule_parameter_is_an_extension_field_a_preset_key_and_a_flag():
    """What a user can set on an own model's schedule (``posenc.rope.SCHEDULES[name].defaults``) can be set on a
    pretrained one: an ``Extension`` field, a key of both commands' configs and a flag of both commands."""
    import dataclasses

    from posenc import rope
    from posenc.jobs.extend import SCHEDULE_KEYS
    from posenc.jobs.finetune import FinetuneConfig

    params = {k for s in rope.SCHEDULES.values() for k in s.defaults}
    assert params <= {f.name for f in dataclasses.fields(Extension)}
    keys = {
        "factor": "factor",
        "original_max_position_embeddings": "original_max_position_embeddings",
        **{param: key for key, param in SCHEDULE_KEYS.items()},
    }
    assert params <= set(keys)
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for command, cfg in (("extend", ExtendConfig), ("finetune", FinetuneConfig)):
        flags = {o for a in sub.choices[command]._actions for o in a.option_strings}
        for p in params:
            assert keys[p] in cfg.model_fields and f"--{keys[p].replace('_', '-')}" in flags, (command, p)
    cfg = parse("--quick", "--schedules", "llama3", "--low-freq-factor", "2", "--high-freq-factor", "8")
    assert extension(cfg, "llama3") == Extension("llama3", 2.0, low_freq_factor=2.0, high_freq_factor=8.0)
