import shutil

import pytest

from tests.cli.runs import trained_runs


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 2-step RoPE run and a one-scheme quick compare run (``trained_runs``), copied per test by ``runs``."""
    return trained_runs(tmp_path_factory.mktemp("runs"))


@pytest.fixture
def runs(trained, tmp_path):
    shutil.copytree(trained, tmp_path, dirs_exist_ok=True)
    return tmp_path
