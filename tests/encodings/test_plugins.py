"""Schemes as plugins (issue 25 item 6): entry points of ``posenc.schemes``, ``posenc --import`` and ``POSENC_IMPORT``
make a scheme written outside posenc usable in every command, compare's job processes included."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import posenc
from posenc import encodings
from posenc.cli.main import main
from posenc.encodings import Encoding, registry
from posenc.encodings.base import PositionState
from posenc.encodings.bias import alibi_slopes, distance_bias
from posenc.errors import PosencError
from posenc.jobs.launcher import scheme_modules
from posenc.reports.text import markdown
from posenc.store.checkpoint import read_json

PLUGIN = '''"""A scheme written outside posenc: ALiBi at half slope."""
import torch

from posenc.encodings import Encoding, register
from posenc.encodings.bias import alibi_slopes, distance_bias


class HalfALiBi(Encoding):
    """ALiBi at half slope (a plugin)."""

    name = "NAME"
    family, source = "plugins", "tests/encodings/test_plugins.py"
    has_bias = True

    def __init__(self, dims):
        super().__init__(dims)
        self.register_buffer("slopes", alibi_slopes(dims.n_head) / 2, persistent=False)

    def bias(self, inp):
        return distance_bias(self.slopes, inp.pos, torch.promote_types(inp.x.dtype, torch.float32))
'''


def _module(folder: Path, module: str, scheme: str, decorate: bool = True) -> Path:
    path = folder / f"{module}.py"
    text = PLUGIN.replace("NAME", scheme)
    path.write_text(text.replace("class HalfALiBi", "@register\nclass HalfALiBi") if decorate else text)
    return path


def _distribution(folder: Path, module: str, entry_points: str) -> None:
    """An installed distribution as pip leaves it: its .dist-info with METADATA and entry_points.txt."""
    info = folder / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[posenc.schemes]\n{entry_points}\n")


def _posenc(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    code = "import sys; from posenc.cli.main import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True, env={**os.environ, **env}
    )


@pytest.fixture
def forget_plugins(monkeypatch):
    """Restore the registry, sys.modules and POSENC_IMPORT after a test that loads plugins in this process."""
    before, modules = set(encodings.names()), set(sys.modules)
    monkeypatch.setenv(registry.IMPORT_VAR, "")
    yield
    for name in set(encodings.names()) - before:
        encodings.unregister(name)
    for name in set(sys.modules) - modules:
        registry._PLUGINS.discard(name)
        del sys.modules[name]


def test_entry_points_load_when_the_registry_is_first_used(tmp_path, monkeypatch, forget_plugins):
    _module(tmp_path, "ep_module_plugin", "ep-module")
    _module(tmp_path, "ep_class_plugin", "ep-class", decorate=False)
    _distribution(tmp_path, "ep_plugins", "ep-module = ep_module_plugin\nep-class = ep_class_plugin:HalfALiBi")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    assert {"ep-module", "ep-class"} <= set(encodings.names())
    assert encodings.get("ep-class+rope").describe()
    assert {"ep_module_plugin", "ep_class_plugin"} <= encodings.plugin_modules()


def test_import_schemes_joins_posenc_import_and_jobs_leave_plugins_to_the_job(tmp_path, forget_plugins):
    path = _module(tmp_path, "local_plugin", "local-scheme")
    assert encodings.import_schemes(str(path)) == "local_plugin"
    assert encodings.import_schemes(str(path)) == "local_plugin"  # again: the module is not run twice
    assert os.environ[registry.IMPORT_VAR] == str(path.resolve())
    assert encodings.get("local-scheme").has_bias
    assert scheme_modules(["local-scheme+rope"]) == [
        "posenc.encodings.rotary"
    ]  # the job imports local_plugin from POSENC_IMPORT


def test_an_import_that_fails_is_one_line(tmp_path, capsys, forget_plugins):
    (tmp_path / "broken_plugin.py").write_text("raise RuntimeError('boom')\n")
    with pytest.raises(PosencError, match=r"cannot import '.*broken_plugin.py': RuntimeError: boom"):
        encodings.import_schemes(str(tmp_path / "broken_plugin.py"))
    assert "broken_plugin" not in sys.modules and os.environ[registry.IMPORT_VAR] == ""
    (tmp_path / "other").mkdir()
    _module(tmp_path / "other", "os", "never")
    with pytest.raises(PosencError, match="a module named 'os' is imported already"):
        encodings.import_schemes(str(tmp_path / "other" / "os.py"))
    assert main(["--import", str(tmp_path / "missing.py"), "list"]) == 2
    assert capsys.readouterr().err == f"posenc: error: cannot import {str(tmp_path / 'missing.py')!r}: no such file\n"
    assert main(["--import", "no_such_plugin_module", "list"]) == 2
    assert "cannot import 'no_such_plugin_module': ModuleNotFoundError" in capsys.readouterr().err


def test_posenc_import_lists_modules_and_files(tmp_path):
    _module(tmp_path, "env_module_plugin", "env-module")
    (tmp_path / "elsewhere").mkdir()  # not on the path: imported as a file
    path = _module(tmp_path / "elsewhere", "env_file_plugin", "env-file")
    out = _posenc(["list"], tmp_path, PYTHONPATH=str(tmp_path), POSENC_IMPORT=f"env_module_plugin, {path}")
    assert out.returncode == 0, out.stderr
    assert "env-module" in out.stdout and "env-file" in out.stdout


@pytest.mark.slow
def test_an_entry_point_scheme_runs_in_compare(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    _module(site, "myscheme_plugin", "myscheme")
    _distribution(site, "myscheme_plugin", "myscheme = myscheme_plugin")
    out = _posenc(
        ["compare", "--preset", "quick", "--steps", "2", "--schemes", "myscheme", "--out", "runs", "--name", "ep"],
        tmp_path,
        PYTHONPATH=str(site),
    )
    assert out.returncode == 0, out.stderr
    assert "| myscheme |" in (tmp_path / "runs" / "ep" / "report.md").read_text()


@pytest.mark.slow
def test_an_imported_file_scheme_runs_in_compare(tmp_path):
    (tmp_path / "local").mkdir()
    _module(tmp_path / "local", "filescheme", "filescheme")
    out = _posenc(
        [
            "--import",
            "local/filescheme.py",
            "compare",
            "--preset",
            "quick",
            "--steps",
            "2",
            "--schemes",
            "filescheme",
            "--out",
            "runs",
            "--name",
            "file",
        ],
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "| filescheme |" in (tmp_path / "runs" / "file" / "report.md").read_text()
    run = tmp_path / "runs" / "file" / "filescheme" / "seed0"
    assert read_json(run / "config.json")["plugins"] == [
        {"module": "filescheme", "file": str((tmp_path / "local" / "filescheme.py").resolve())}
    ]
    # another process without the plugin: one line naming what to import, exit 2 (it said "unknown scheme")
    gen = _posenc(["generate", str(run), "--prompt", "ab", "--max-new-tokens", "2"], tmp_path)
    assert gen.returncode == 2 and gen.stderr.strip().splitlines()[-1] == (
        f"posenc: error: {run} was trained with the scheme plugin {(tmp_path / 'local' / 'filescheme.py').resolve()}: "
        f"load it with posenc --import {(tmp_path / 'local' / 'filescheme.py').resolve()} (or POSENC_IMPORT)"
    )
    assert (
        _posenc(
            ["--import", "local/filescheme.py", "generate", str(run), "--prompt", "ab", "--max-new-tokens", "2"],
            tmp_path,
        ).returncode
        == 0
    )


@pytest.mark.parametrize("flag, hook", [("has_bias", "bias"), ("rotary", "phases")])
def test_a_scheme_whose_flags_disagree_with_its_hooks_is_refused_when_it_registers(flag, hook):
    """A bias() under has_bias = False was applied in training and dropped in cached decoding (0.395 logits off)."""
    hooks = {"bias": lambda self, inp: None, "phases": lambda self, inp: None}
    silent = type("Silent", (encodings.Encoding,), {"name": "silent-flag", hook: hooks[hook]})
    with pytest.raises(PosencError, match=f"scheme 'silent-flag' implements {hook}\\(\\) but declares {flag} = False"):
        registry.register(silent)
    empty = type("Empty", (encodings.Encoding,), {"name": "empty-flag", flag: True})
    with pytest.raises(
        PosencError, match=f"scheme 'empty-flag' declares {flag} = True but does not implement {hook}\\(\\)"
    ):
        registry.register(empty)
    assert "silent-flag" not in encodings.names() and "empty-flag" not in encodings.names()


class _HalfBias(Encoding):
    """Half ALiBi's bias, its has_bias listed in instance_flags and never set (or, unregistered, not declared)."""

    instance_flags = ("has_bias",)

    def __init__(self, dims):
        super().__init__(dims)
        self.register_buffer("slopes", alibi_slopes(dims.n_head) / 2, persistent=False)

    def bias(self, inp):
        return distance_bias(self.slopes, inp.pos, torch.promote_types(inp.x.dtype, torch.float32))


def _decode_then_forward(layer, x):
    """The layer's cached prefill of x[:, :5] (the first use), then its parallel forward of x."""
    errors = []
    for call in (lambda: layer(x[:, :5], cache=posenc.LayerCache()), lambda: layer(x)):
        with pytest.raises(PosencError) as exc:
            call()
        errors.append(str(exc.value))
    return errors


@pytest.mark.parametrize("flagged", [True, False], ids=["flag-never-set", "flag-set-in-constructor"])
def test_a_flag_listed_in_instance_flags_is_read_alike_by_forward_and_decoding(flagged):
    """A bias() under an instance flag never set was applied by the forward and dropped by decoding (0.029): now the
    first forward or cached step refuses it in one line; set in the constructor, decoding equals the forward."""
    cls = type("HalfBias", (_HalfBias,), {"name": "half-bias-flag"})
    if not flagged:
        cls.__init__ = lambda self, dims: (_HalfBias.__init__(self, dims), setattr(self, "has_bias", True))[0]
    registry.register(cls)
    try:
        torch.manual_seed(0)
        layer, x = posenc.Attention(32, 4, "half-bias-flag").double().eval(), torch.randn(2, 9, 32, dtype=torch.float64)
        if flagged:
            want = "scheme 'half-bias-flag': bias() gave a value while has_bias is False: set has_bias = True"
            assert all(e.startswith(want) and "\n" not in e for e in _decode_then_forward(layer, x))
            m = posenc.build_model({"encoding": "half-bias-flag", "n_layer": 1, "d_model": 32, "n_head": 4}).eval()
            with pytest.raises(PosencError, match="bias\\(\\) gave a value while has_bias is False"):
                m.generate(torch.tensor([1, 2, 3]), 2)
            return
        cache = posenc.LayerCache()
        steps = [layer(x[:, :5], cache=cache)] + [layer(x[:, t : t + 1], cache=cache) for t in range(5, 9)]
        assert (torch.cat(steps, dim=1) - layer(x)).abs().max().item() < 1e-10
        plain = posenc.Attention(32, 4, "nope").double().eval()
        plain.load_state_dict(layer.state_dict())
        assert (plain(x) - layer(x)).abs().max().item() > 1e-3  # the bias is applied
    finally:
        registry.unregister("half-bias-flag")


def test_an_unregistered_encoding_whose_flags_disagree_is_refused_by_the_layer():
    """Passed built to posenc.Attention, a class that never went through register: the same check, at construction
    (decoding was 0.041 off the forward)."""
    cls = type("Unregistered", (_HalfBias,), {"name": "unregistered", "instance_flags": ()})
    with pytest.raises(PosencError) as exc:
        posenc.Attention(32, 4, cls(encodings.Dims(4, 8, 32, 0, 16)))
    assert str(exc.value) == (
        "scheme 'unregistered' implements bias() but declares has_bias = False: set has_bias = True "
        "(or list it in instance_flags when the constructor sets it)"
    )
    listed = type("Listed", (_HalfBias,), {"name": "listed"})(encodings.Dims(4, 8, 32, 0, 16))
    layer = posenc.Attention(32, 4, listed).double().eval()  # listed in instance_flags: checked at first use
    errors = _decode_then_forward(layer, torch.randn(1, 9, 32, dtype=torch.float64))
    assert all(e.startswith("scheme 'listed': bias() gave a value while has_bias is False") for e in errors)


def test_a_bias_hook_giving_a_bare_tile_function_is_refused_in_one_line():
    """bias() gives a ``posenc.attention.Bias`` (the tile function and its faster forms, which the core dispatches
    on); a bare tile function is refused in one line by the forward and by cached decoding, not an AttributeError
    inside the core."""
    cls = type("BareTile", (_HalfBias,), {"name": "bare-tile", "has_bias": True, "instance_flags": ()})
    cls.bias = lambda self, inp: _HalfBias.bias(self, inp).tile
    cls.decoder = lambda self: PositionState(self)
    layer, x = posenc.Attention(32, 4, cls(encodings.Dims(4, 8, 32, 0, 16))), torch.randn(1, 9, 32)
    want = "scheme 'bare-tile': bias() gave a function, not a posenc.attention.Bias (wrap a tile function: Bias(tile))"
    assert _decode_then_forward(layer, x) == [want, want]


def test_a_schemes_description_names_its_parameters(forget_plugins):
    """The report's Schemes line of ``slope-alibi:learn=true`` says learn=true (it said ``slope-alibi``)."""

    @registry.register
    class SlopeALiBi(Encoding):
        name = "slope-alibi-test"
        has_bias = True

        def __init__(self, dims, learn: bool = False, scale: float = 1.0):
            super().__init__(dims)
            self.register_buffer("slopes", alibi_slopes(dims.n_head) * scale, persistent=False)

        def bias(self, inp):
            return distance_bias(self.slopes, inp.pos, torch.float32)

    line = encodings.describe("slope-alibi-test:learn=true,scale=0.5")
    assert "learn=true" in line and "scale=0.5" in line
    text = markdown(
        [], {}, {"descriptions": {"slope-alibi-test:learn=true": encodings.describe("slope-alibi-test:learn=true")}}
    )
    assert "slope-alibi-test:learn=true`: slope-alibi-test:learn=true" in text.split("## Schemes")[1]


def test_a_file_inside_a_package_imports_its_siblings_from_any_folder(tmp_path):
    """`make demo`'s `--import experiments/accumulated/claims.py` from the console script: the script's folder, not
    the checkout, is on sys.path, so the study's `from experiments.accumulated import window` needs the package
    root that the file's __init__.py files name."""
    study = tmp_path / "root" / "study"
    (study / "sub").mkdir(parents=True)
    for init in (study / "__init__.py", study / "sub" / "__init__.py"):
        init.write_text("")
    _module(study, "helper", "pkg-scheme", decorate=False)
    (study / "sub" / "plugin.py").write_text(
        "from study import helper\nfrom posenc.encodings import register\nregister(helper.HalfALiBi)\n"
    )
    (tmp_path / "elsewhere").mkdir()
    src = str(Path(posenc.__file__).parents[1])
    out = _posenc(["--import", str(study / "sub" / "plugin.py"), "list"], tmp_path / "elsewhere", PYTHONPATH=src)
    assert out.returncode == 0, out.stderr
    assert "pkg-scheme" in out.stdout
    claims = Path(__file__).parents[2] / "experiments" / "accumulated" / "claims.py"
    out = _posenc(["--import", str(claims), "compare", "--preset", "retrieval", "--dry-run"], tmp_path, PYTHONPATH=src)
    assert out.returncode == 0, out.stderr
    assert "jobs" in out.stdout


def test_a_package_file_shadowed_by_another_module_of_its_name_is_one_line(tmp_path, forget_plugins):
    pkg = tmp_path / "posenc"  # a folder named like an imported package: its file is not the imported module's
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("raise RuntimeError('never run')\n")
    with pytest.raises(PosencError, match=r"cannot import .*errors.py': a module named 'posenc.errors' is imported"):
        encodings.import_schemes(str(pkg / "errors.py"))
