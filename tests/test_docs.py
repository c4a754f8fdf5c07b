"""The documentation site (mkdocs.yml, docs/): it builds strictly, and its worked plugin runs as the page says."""

import dataclasses
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest
import torch

import posenc
from posenc import encodings
from posenc.encodings import registry
from posenc.errors import PosencError

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "docs" / "examples" / "my_plugin.py"
SMALL = {"n_layer": 2, "d_model": 32, "n_head": 4, "train_length": 16}


def test_the_site_builds_strictly(tmp_path):
    """`mkdocs build --strict`: a broken link or anchor, a missing snippet or a dangling API reference fails it; the
    built site works opened from file:// (pages as page.html, search inlined)."""
    site = tmp_path / "site"
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(site)]
    proc = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    plugins = (site / "plugins.html").read_text()
    # the worked plugin's file is in the page (a formatter that rewrites the snippet marker leaves it out)
    assert "A scheme written outside posenc: ALiBi with its slopes scaled" in plugins
    assert "--8&lt;" not in plugins and "--8 &lt;" not in plugins
    assert (site / "results" / "default" / "ppl_ratio.png").is_file()  # the committed results are served
    assert "distance_bias" in (site / "api.html").read_text()  # the API reference is generated
    _assert_opens_from_file_urls(site)


def _assert_opens_from_file_urls(site: Path) -> None:
    """Every relative link of every page names a file of the site: opened from file://, a link to a folder shows
    the folder's listing (no server turns `plots/` into `plots/index.html`); search reads an inlined index."""
    pages = [p for p in sorted(site.rglob("*.html")) if p.name != "404.html"]  # a server's page: absolute links
    assert len(pages) > 20
    to_folders = []
    for page in pages:
        for link in re.findall(r'(?:href|src)="([^"#?]+)[^"]*"', page.read_text()):
            if re.match(r"[a-z][a-z0-9+.-]*:|//", link):  # https:, mailto:, data: ... leave the site
                continue
            if not (page.parent / unquote(link)).is_file():  # a browser decodes %3D before it opens the file
                to_folders.append(f"{page.relative_to(site)} -> {link}")
    assert not to_folders, to_folders[:20]
    assert (site / "search" / "search_index.js").is_file()


@pytest.fixture
def plugin():
    """docs/examples/my_plugin.py imported as the page says, unregistered again afterwards."""
    module = encodings.import_schemes(str(PLUGIN))
    yield sys.modules[module]
    encodings.unregister("scaled-alibi")
    registry._PLUGINS.discard(module)
    del sys.modules[module]


def _logits(spec: str, tokens: torch.Tensor) -> torch.Tensor:
    torch.manual_seed(0)
    return posenc.build_model({"encoding": spec, **SMALL}).double().eval()(tokens)


def test_the_worked_plugin_registers_and_reimplements_alibi(plugin):
    assert "scaled-alibi" in encodings.names()
    assert "scaled-alibi" in [name for name, _, _ in encodings.catalogue()["plugins"]]
    assert [(p.name, p.default) for p in encodings.parameters("scaled-alibi")] == [("scale", 1.0)]
    tokens = torch.randint(0, 256, (2, 40))  # past the training length
    alibi = _logits("alibi", tokens)
    assert torch.allclose(_logits("scaled-alibi", tokens), alibi, atol=1e-12)
    assert not torch.allclose(_logits("scaled-alibi:scale=0.5", tokens), alibi, atol=1e-3)
    enc = encodings.get("scaled-alibi:scale=0.5")
    tile = enc.bias(encodings.Inputs(torch.zeros(1, 5, 128), torch.arange(5))).tile(0, 5, 0, 5)
    m = encodings.bias.alibi_slopes(4)[None, :, None, None] / 2
    assert torch.allclose(tile.double(), -m * (torch.arange(5)[:, None] - torch.arange(5)[None, :]), atol=1e-6)
    with pytest.raises(PosencError, match="scale must be > 0"):
        encodings.get("scaled-alibi:scale=0")


def test_the_worked_plugin_decodes_through_the_cache(plugin):
    torch.manual_seed(0)
    model = posenc.build_model({"encoding": "scaled-alibi:scale=2", **SMALL}).double().eval()
    prompt = torch.randint(0, 256, (1, 6))
    out = model.generate(prompt, max_new_tokens=10, temperature=0)
    seq = prompt
    for _ in range(10):  # greedy decoding by full recomputation
        seq = torch.cat([seq, model(seq)[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(out, seq)


def test_the_readme_api_example_runs_verbatim():
    """The README's ten-line example is code a newcomer pastes: it runs as printed (its own asserts included)."""
    code = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    assert "posenc.build_model(" in code and "posenc.Attention(" in code and len(code.strip().splitlines()) <= 10
    exec(compile(code, "README.md", "exec"), {})


def test_the_readme_stays_a_front_page():
    """At most 200 lines (issue 38): the rest belongs in docs/, and every docs page it links exists."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    linked = set(re.findall(r"\]\((docs/[^)#]+)", readme))
    assert {"docs/usage.md", "docs/plugins.md", "docs/api.md"} <= linked
    assert [f for f in linked if not (ROOT / f).is_file()] == []


def test_the_plugin_page_gives_each_hook_its_exact_signature():
    """docs/plugins.md states every hook as base.py defines it: a changed signature makes the page wrong, and this
    fail."""
    page = (ROOT / "docs" / "plugins.md").read_text()
    hooks = (
        "embed",
        "phases",
        "steps",
        "bias",
        "attend",
        "logits",
        "decoder",
        "length_key",
        "spectral_gap",
    )
    for hook in hooks:
        signature = str(inspect.signature(getattr(encodings.Encoding, hook))).replace("'", "")
        assert f"`{hook}{signature}`" in page, (hook, signature)
    assert all(f"`{flag}`" in page for flag in registry.FLAG_HOOKS)
    assert all(
        f"`{field.name}`" in page for cls in (encodings.Dims, encodings.Inputs) for field in dataclasses.fields(cls)
    )
