"""The stylized model's formulas that restate a scheme's (posenc.theory.decay) are tested against it;
RoPE's frequencies and the rotation it imports (posenc.rope, posenc.attention)."""

import torch

from posenc import encodings
from posenc.encodings.base import Dims
from posenc.encodings.polar import pope_freqs
from posenc.encodings.xpos import xpos_zeta
from posenc.theory import decay


def test_frequencies_and_decays_are_the_schemes():
    for d in (8, 64):
        assert torch.allclose(decay.xpos_zeta(d), xpos_zeta(d), rtol=0, atol=1e-15)
        assert torch.allclose(decay.pope_frequencies(d), pope_freqs(d), rtol=1e-15)
        assert torch.allclose(decay.pope_frequencies(d, survey_sign=True), 1 / pope_freqs(d), rtol=1e-12)


def test_sinusoidal_table_is_the_embedding():
    d, pos = 16, torch.arange(0, 5000, 7)
    enc = encodings.get("sinusoidal", Dims(n_head=2, head_dim=8, d_model=d, vocab_size=8, train_length=16))
    assert torch.allclose(decay.sinusoidal_table(pos.double(), d).float(), enc.embed(pos), atol=1e-6)
