"""One config dialect: base presets, --set, the documented format (issue 38 item 3)."""

import importlib.util
import json
from pathlib import Path

import pytest

from posenc.cli.common import given_settings
from posenc.cli.compare_cmd import FLAGS
from posenc.cli.main import build_parser, main
from posenc.config.plan import ClusterConfig, EvalConfig, Preset, SweepConfig, TaskEvalConfig, load_preset
from posenc.errors import PosencError
from posenc.jobs import extend, finetune
from posenc.jobs.job import ScheduleJob
from posenc.jobs.launcher import record_run
from posenc.model import ModelConfig
from posenc.store.presets import _field_infos, parse_set, preset_names, reference
from posenc.train.settings import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
RESOLVED = ROOT / "tests" / "fixtures" / "presets_resolved"


def _resolved():
    yield from ((f"{n}.json", load_preset(n)) for n in preset_names())
    yield from ((f"extend-{n}.json", extend.load_extend_config(n)) for n in extend.preset_names())
    yield from ((f"finetune-{n}.json", finetune.load_finetune_config(n)) for n in finetune.preset_names())


def test_every_shipped_preset_resolves_as_before_the_rebase():
    rows = dict(_resolved())
    assert sorted(rows) == sorted(p.name for p in RESOLVED.glob("*.json"))
    for name, cfg in rows.items():
        assert json.loads(json.dumps(cfg.model_dump(mode="json"))) == json.loads((RESOLVED / name).read_text()), name


def test_the_shipped_presets_share_blocks_through_base():
    from posenc.store.presets import SHIPPED

    studies = ROOT / "experiments" / "accumulated" / "presets"  # registered by the study's module (conftest imports it)
    shipped = sorted(p.stem for p in SHIPPED.iterdir() if p.suffix == ".yaml")
    assert shipped == ["default", "quick"]  # the library ships the demo and its quick version; a study's live with it
    assert set(preset_names()) == {*shipped, *(p.stem for p in studies.iterdir() if p.suffix == ".yaml")}

    def where(n):
        return SHIPPED / f"{n}.yaml" if (SHIPPED / f"{n}.yaml").is_file() else studies / f"{n}.yaml"

    bases = {
        n: next((line.split()[1] for line in where(n).read_text().splitlines() if line.startswith("base:")), None)
        for n in preset_names()
    }
    assert {n: b for n, b in bases.items() if b} == {
        "baselines": "default",
        "learned": "default",
        "quick": "default",
        "window": "default",
        "state-tracking": "retrieval",
        "retrieval-matched": "retrieval",
        "retrieval-matched-mqar": "retrieval",
        "retrieval-matched-far": "retrieval-matched",
        "retrieval-matched-mqar-far": "retrieval-matched-mqar",
        "state-tracking-far": "state-tracking",
    }


def _write(folder: Path, name: str, text: str) -> Path:
    (folder / name).write_text(text)
    return folder / name


def test_base_deep_merges_sections_and_replaces_lists_and_free_mappings(tmp_path):
    _write(
        tmp_path,
        "mid.yaml",
        "name: mid\ndescription: the middle\nbase: quick\ntrain: {lr: 5.0e-3}\n"
        "eval: {passkey: {trials: 3}}\nsweep: {grid: {train.lr: [1e-3, 2e-3]}, schemes: {rope: {train.steps: [4]}}}\n",
    )
    child = _write(
        tmp_path,
        "child.yaml",
        "name: child\nbase: ./mid.yaml\ntrain: {steps: 7}\nschemes: [rope]\n"
        "eval: {multiples: [1, 2]}\nsweep: {grid: {model.n_head: [1, 2]}}\n",
    )
    quick, p = load_preset("quick"), load_preset(str(child))
    assert p.name == "child" and p.description == ""  # own keys: never the base's
    assert (p.train.steps, p.train.lr, p.train.batch_size) == (7, 5e-3, quick.train.batch_size)  # merged key by key
    assert p.model == quick.model and p.schemes == ["rope"] and p.eval.multiples == [1, 2]  # lists replace whole
    assert p.eval.passkey.trials == 3 and p.eval.passkey.depths == quick.eval.passkey.depths
    assert p.sweep.grid == {"model.n_head": [1, 2]} and p.sweep.schemes == {
        "rope": {"train.steps": [4]}
    }  # grid replaced


def test_a_cycle_of_bases_and_a_bad_base_are_one_line_errors(tmp_path):
    _write(tmp_path, "a.yaml", "name: a\nbase: b.yaml\n")
    _write(tmp_path, "b.yaml", "name: b\nbase: a.yaml\n")
    with pytest.raises(PosencError, match=r"^preset a.yaml: its bases form a cycle \(a.yaml -> b.yaml -> a.yaml\)$"):
        load_preset(str(tmp_path / "a.yaml"))
    with pytest.raises(PosencError, match="cycle"):
        load_preset(str(_write(tmp_path, "self.yaml", "name: s\nbase: self.yaml\n")))
    with pytest.raises(PosencError, match="base must be a preset's name or path, got 3"):
        load_preset(str(_write(tmp_path, "n.yaml", "name: n\nbase: 3\n")))
    with pytest.raises(PosencError, match=r"unknown preset 'nosuch'.* \(base of .*u\.yaml\)$"):
        load_preset(str(_write(tmp_path, "u.yaml", "name: u\nbase: nosuch\n")))


def _compare_args(*argv):
    return build_parser().parse_args(["compare", "--preset", "quick", *argv])


def test_the_description_note_names_a_changed_grid():
    grid = load_preset("retrieval", {"sweep.grid": {"train.lr": [1e-3]}})
    assert grid.sweep.grid == {"train.lr": [1e-3]}
    assert grid.description.endswith("[The preset as written; this run sets sweep.grid = {'train.lr': [0.001]}.]")
    assert load_preset("retrieval", {"sweep": None}).description.endswith("this run sets no sweep.]")
    assert "this run sets" not in load_preset("retrieval", {"sweep.grid": {"train.lr": [3e-4, 1e-3, 3e-3]}}).description
    # the lengths are the run's, every invocation's together: a rerun's [2] said "this run sets" beside tables of 1x, 2x
    assert (
        "this run sets" not in load_preset("retrieval", {"eval.multiples": [2], "task_eval.multiples": [1]}).description
    )


def test_flags_and_set_are_one_mechanism_and_the_last_given_wins():
    by_flag = load_preset("quick", given_settings(_compare_args("--steps", "5", "--schemes", "rope"), FLAGS))
    by_set = load_preset(
        "quick", given_settings(_compare_args("--set", "train.steps=5", "--set", "schemes=[rope]"), FLAGS)
    )
    assert by_flag == by_set and by_set.train.steps == 5 and "this run sets train.steps = 5" in by_set.description
    twice = _compare_args("--set", "train.steps=5", "--set", "train.steps=6")
    assert load_preset("quick", given_settings(twice, FLAGS)).train.steps == 6
    with pytest.raises(PosencError, match="--steps 5 and --set train.steps=6 disagree: give one"):
        given_settings(_compare_args("--steps", "5", "--set", "train.steps=6"), FLAGS)  # the flag lost silently


def test_set_reaches_any_key_with_yaml_values():
    args = _compare_args(
        "--set",
        "train.lr=3e-4",
        "--set",
        "eval.passkey={trials: 1}",
        "--set",
        "cluster.partition=gpu",
        "--set",
        "sweep.grid.train.warmup=[10,20]",
        "--set",
        "model.encoding_params.a=0.5",
        "--set",
        "seeds=[0, 1]",
        "--set",
        "schemes=[acc-rand-qkv]",
    )
    p = load_preset("quick", given_settings(args, FLAGS))
    quick = load_preset("quick")
    assert p.train.lr == 3e-4 and isinstance(p.train.lr, float)  # 3e-4 is a float, as in YAML 1.2
    assert (
        p.eval.passkey.trials == 1 and p.eval.passkey.depths == quick.eval.passkey.depths
    )  # a section's mapping merges
    assert p.cluster == ClusterConfig(partition="gpu") and p.sweep.grid == {"train.warmup": [10, 20]}
    assert p.model.encoding_params == {"a": 0.5} and p.seeds == [0, 1]
    assert load_preset("quick", given_settings(_compare_args("--set", "sweep=null"), FLAGS)).sweep is None


@pytest.mark.parametrize(
    "text, value",
    [
        ("on", "on"),  # YAML 1.1: True
        ("no", "no"),  # YAML 1.1: False
        ("010", 10),  # YAML 1.1: 8
        ("1:30", "1:30"),  # YAML 1.1: 90
        ("1_000", "1_000"),  # YAML 1.1: 1000
        ("3e-3", 0.003),  # YAML 1.1: a string
        ("0o10", 8),
        ("0x1f", 31),
        ("-.inf", float("-inf")),
        ("True", True),
        ("[1, 2e-3, off]", [1, 0.002, "off"]),
    ],
)
def test_values_are_read_as_yaml_1_2_core_schema(text, value):
    assert parse_set(f"k={text}") == ("k", value)


def test_a_yaml_1_1_boolean_for_a_bool_setting_is_refused(capsys):
    assert main(["compare", "--preset", "quick", "--set", "train.compile=yes", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "train.compile=yes" in err and "valid boolean" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--set", "train.foo=1"], "--set train.foo: unknown key 'foo' in train (valid: batch_size, steps, lr,"),
        (["--set", "bogus=1"], "--set bogus: unknown key 'bogus' at the top (valid: name, description, model,"),
        (["--set", "train.lr=-1"], "invalid train.lr=-1 (command line): Input should be greater than 0"),
        (
            ["--set", "eval.passkey.trials=x"],
            "invalid eval.passkey.trials=x (command line): Input should be a valid integer",
        ),
        (["--set", "train.lr.x=1"], "--set train.lr.x: train.lr takes a value, not keys"),
        (["--set", "train.lr"], "--set expects KEY=VALUE"),
        (["--set", "train.lr=[1"], "--set train.lr: '[1' is not a YAML value"),
    ],
)
def test_a_bad_set_is_one_line_exit_2_naming_the_key(argv, message, capsys):
    assert main(["compare", "--preset", "quick", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"posenc: error: {message}") and err.count("\n") == 1


def test_set_on_train_extend_and_finetune(capsys):
    from posenc.cli import extend_cmd, finetune_cmd

    ft = finetune_cmd.config(
        build_parser().parse_args(["finetune", "--quick", "--lora-rank", "4", "--set", "lora_alpha=32"])
    )
    assert (ft.lora_rank, ft.lora_alpha) == (4, 32.0)
    ex = extend_cmd.config(
        build_parser().parse_args(["extend", "--quick", "--set", "bucket=512", "--set", "passkey_depths=[0.2]"])
    )
    assert (ex.bucket, ex.passkey_depths) == (512, [0.2])
    assert main(["extend", "--quick", "--set", "buckets=5"]) == 2 and "unknown key 'buckets'" in capsys.readouterr().err
    assert main(["train", "--scheme", "rope", "--preset", "quick", "--set", "model.n_layers=2"]) == 2
    assert "--set model.n_layers: unknown key 'n_layers' in model" in capsys.readouterr().err


def test_set_cannot_change_a_finished_compare_runs_settings(tmp_path, capsys):
    record_run(tmp_path / "quick", load_preset("quick"))  # what a finished run leaves: its resolved preset
    assert main(["compare", "--preset", "quick", "--out", str(tmp_path), "--set", "train.lr=1e-3"]) == 2
    err = capsys.readouterr().err
    assert "holds results made with other settings (train.lr 0.003 -> 0.001)" in err and err.count("\n") == 1


def test_set_cannot_change_a_trained_runs_settings_on_resume(tmp_path, capsys):
    out = str(tmp_path / "run")
    tiny = [
        "--set",
        "model.d_model=16",
        "--set",
        "model.n_layer=1",
        "--set",
        "model.train_length=16",
        "--set",
        "train.batch_size=2",
    ]
    assert main(["train", "--scheme", "rope", "--preset", "quick", "--steps", "2", "--out", out, *tiny]) == 0
    capsys.readouterr()
    assert (
        main(
            [
                "train",
                "--scheme",
                "rope",
                "--preset",
                "quick",
                "--steps",
                "2",
                "--out",
                out,
                "--resume",
                *tiny,
                "--set",
                "train.lr=1e-3",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "its training differs (lr 0.003 -> 0.001)" in err and err.count("\n") == 1


def test_every_field_is_documented_in_docs_presets_md():
    spec = importlib.util.spec_from_file_location("make_presets", ROOT / "docs" / "make_presets.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    doc = (ROOT / "docs" / "presets.md").read_text()
    assert doc.endswith(make.generated()), "docs/presets.md is stale: run docs/make_presets.py"
    assert "(undocumented)" not in reference(Preset)
    for cls in (extend.ExtendConfig, finetune.FinetuneConfig):  # a flat preset's left-out key: a documented default
        assert "(undocumented)" not in reference(cls) and reference(cls) in doc
    tables = doc.split(make.MARK)[1]
    for cls, section in (
        (Preset, "the top level"),
        (ModelConfig, "`model`"),
        (TrainConfig, "`train`"),
        (EvalConfig, "`eval`"),
        (TaskEvalConfig, "`task_eval`"),
        (SweepConfig, "`sweep`"),
    ):
        table = tables.split(f"### {section} ({cls.__name__})")[1].split("###")[0]
        for name, (_, _, _, description) in _field_infos(cls).items():
            assert description and f"| `{name}` |" in table, (cls.__name__, name)


@pytest.mark.parametrize(
    "text, message",
    [
        ("train: {steps: true}", "train.steps: Input should be a valid integer"),
        ("model: {n_layer: false}", "model.n_layer: Input should be a valid integer"),
        ("eval: {passkey: {trials: true}}", "eval.passkey.trials: Input should be a valid integer"),
        ("train: {lr: true}", "train.lr: Input should be a valid number"),
        ("train: {steps: 1.0e3}", "train.steps: Input should be a valid integer"),
        ("seeds: [true]", "seeds.0: Input should be a valid integer"),
    ],
)
def test_a_bool_or_a_float_is_no_integer_in_any_config(tmp_path, text, message):
    """Strict validation of every config model (one place, ``store.presets.validated``): ``steps: true`` once
    trained 1 step; a whole float once passed as an integer. A number stays a number (``lr: 1`` is 1.0)."""
    with pytest.raises(PosencError, match=rf"^invalid preset p.yaml: {message}$"):
        load_preset(str(_write(tmp_path, "p.yaml", f"name: p\nbase: quick\n{text}\n")))
    assert load_preset("quick", {"train.lr": 1}).train.lr == 1.0
    with pytest.raises(PosencError, match=r"^invalid trials=True \(command line\): Input should be a valid integer$"):
        extend.load_extend_config("quick", {"trials": True})


def test_a_bool_for_an_integer_on_the_command_line_is_one_line_exit_2(tmp_path, capsys):
    argv = ["train", "--preset", "quick", "--scheme", "rope", "--set", "train.steps=true", "--out", str(tmp_path / "r")]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        "posenc: error: invalid train.steps=True (command line): Input should be a valid integer\n"
    )
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("key", ["eval.multiples", "task_eval.multiples"])
def test_empty_evaluation_multiples_are_refused_at_the_config(key, capsys):
    with pytest.raises(PosencError, match=rf"^invalid {key}=\[\] \(command line\): List should have at least 1 item"):
        load_preset("quick", {key: []})
    with pytest.raises(PosencError, match=rf"^invalid {key}.0=0 \(command line\)|^invalid preset"):
        load_preset("quick", {key: [0]})
    assert main(["compare", "--preset", "quick", "--set", f"{key}=[]"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"posenc: error: invalid {key}=[] (command line): List should have") and err.count("\n") == 1


def test_a_yaml_syntax_error_gives_line_and_column(tmp_path):
    path = _write(tmp_path, "p.yaml", "name: p\nbase: quick\ntrain: {steps: 3\nmodel: {}\n")
    with pytest.raises(PosencError) as exc:
        load_preset(str(path))
    assert str(exc.value) == (
        f"preset {path} is not valid YAML: line 4, column 6: expected ',' or '}}', but got ':' "
        "(while parsing a flow mapping at line 3, column 8)"
    )
    with pytest.raises(PosencError) as exc:
        extend.load_extend_config(str(_write(tmp_path, "e.yaml", "a: [1\nb: 2\n")))
    assert str(exc.value).endswith(
        "is not valid YAML: line 2, column 2: expected ',' or ']', but got ':' "
        "(while parsing a flow sequence at line 1, column 4)"
    )


@pytest.mark.parametrize(
    "key, value, message",
    [
        (
            "eval.far_mass.multiples",
            [0],
            r"eval\.far_mass\.multiples\.0: Input should be greater than 0",
        ),  # failed after training
        ("eval.far_mass.multiples", [2, 2], "each entry once: 2 repeated"),  # a spread of 0 over one length
        ("eval.passkey.lengths_multiples", [2, 2], "each entry once: 2 repeated"),
    ],
)
def test_diagnosed_and_passkey_lengths_are_positive_and_given_once(key, value, message):
    with pytest.raises(PosencError, match=message):
        load_preset("quick", {key: value})


def test_schedule_rows_are_labelled_by_every_setting_and_given_once():
    """Two yarn rows of one factor were one row, `rope+yarn(s=4)`, their difference shown as a spread over seeds."""
    rows = [{"schedule": "yarn", "factor": 4, "beta_slow": 0.25}, {"schedule": "yarn", "factor": 4}]
    rows += [{"schedule": "yarn", "factor": 4, "original_max_position_embeddings": 64}]
    p = load_preset("quick", {"eval_schedules": rows})
    job = {"preset": p, "root": Path("x"), "scheme": "rope", "seed": 0, "model": p.model, "train": p.train}
    labels = [ScheduleJob(**job, schedule=s.pop("schedule"), params=s).label() for s in rows]
    assert labels == ["rope+yarn(s=4,beta_slow=0.25)", "rope+yarn(s=4)", "rope+yarn(s=4,L0=64)"]
    same = [
        {"schedule": "yarn", "factor": 4},
        {"schedule": "yarn", "factor": 4, "beta_slow": 1.0},
    ]  # beta_slow's default
    with pytest.raises(PosencError, match=r"eval_schedules has two rows yarn\(s=4\): give each setting once"):
        load_preset("quick", {"eval_schedules": same})


def test_an_empty_preset_and_a_quoted_number_are_named_as_such(tmp_path, capsys):
    """An empty file said "name: Field required"; --set train.steps='"10"' said "train.steps=10 ... integer"."""
    (tmp_path / "e.yaml").write_text("# nothing yet\n")
    assert main(["compare", "--preset", str(tmp_path / "e.yaml"), "--dry-run"]) == 2
    assert (
        capsys.readouterr().err
        == f"posenc: error: preset {tmp_path / 'e.yaml'} is empty: it needs its settings (docs/presets.md)\n"
    )
    assert main(["train", "--preset", "quick", "--scheme", "rope", "--set", 'train.steps="10"', "--dry-run"]) == 2
    assert capsys.readouterr().err.startswith("posenc: error: invalid train.steps='10' (command line): Input should")


def test_a_setting_given_and_swept_is_refused(capsys):
    """--steps 2 beside a grid over train.steps was dropped with exit 0: the jobs trained 5 and 3 steps."""
    argv = ["compare", "--preset", "quick", "--steps", "2", "--set", "sweep={grid: {train.steps: [5, 3]}}", "--dry-run"]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        "posenc: error: preset quick: train.steps is given and swept (the sweep's grid sets it at each point): drop "
        "one (a one-value grid fixes it)\n"
    )
