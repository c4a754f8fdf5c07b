import pytest


@pytest.fixture(autouse=True)
def _registered(accumulated_claims):
    """Every test of experiments/accumulated runs with its claim set registered, as ``posenc --import`` does."""
