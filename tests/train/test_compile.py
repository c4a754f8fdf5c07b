"""Compile-ready training: no graph break in any default scheme's forward; compiled and eager losses agree."""

import dataclasses
import json

import pytest
import torch

from posenc.config.plan import load_preset
from posenc.model import build_model
from posenc.train.loop import train

DEFAULT = load_preset("default").schemes


@pytest.mark.slow
@pytest.mark.parametrize("scheme", DEFAULT)
def test_training_forward_has_no_graph_break(scheme):
    torch._dynamo.reset()
    model = build_model({"encoding": scheme, "n_layer": 2, "n_head": 2, "d_model": 32, "train_length": 16}).train()
    x = torch.randint(0, 256, (2, 16))
    explanation = torch._dynamo.explain(lambda t: model.token_nll(t, t))(x)
    assert explanation.graph_break_count == 0, [str(b.reason) for b in explanation.break_reasons]


@pytest.mark.slow
def test_compiled_and_eager_training_losses_agree(tmp_path):
    preset = load_preset("quick", {"train": {"steps": 3, "log_every": 1}})
    mcfg = dataclasses.replace(preset.model, encoding="hybrid")
    losses = {}
    for flag in (False, True):
        torch._dynamo.reset()
        train(tmp_path / str(flag), mcfg, preset.train.model_copy(update={"compile": flag}))
        losses[flag] = [
            json.loads(line)["loss"] for line in (tmp_path / str(flag) / "train.jsonl").read_text().splitlines()
        ]
    assert len(losses[True]) == 3
    assert max(abs(a - b) for a, b in zip(losses[True], losses[False])) < 1e-5, losses
