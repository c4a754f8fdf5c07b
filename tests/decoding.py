"""Shared check: a drop-in layer decoded through its LayerCache in uneven chunks equals its parallel forward."""

import torch

from posenc import Attention, LayerCache


def assert_grouped_query_decoding_equals_the_parallel_forward(spec: str) -> None:
    """``spec`` in a 4-head layer with 2 key/value heads, float64: chunks (5, 1, 3, 4) of 13 tokens equal the
    forward to 1e-12."""
    torch.manual_seed(0)
    layer = Attention(32, 4, spec, n_kv_head=2, train_length=8).double().eval()
    x = torch.randn(2, 13, 32, dtype=torch.float64)
    cache, out = LayerCache(), []
    with torch.no_grad():
        for s, e in ((0, 5), (5, 6), (6, 9), (9, 13)):
            out.append(layer(x[:, s:e], cache=cache))
        assert torch.allclose(torch.cat(out, 1), layer(x), atol=1e-12)
