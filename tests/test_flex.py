"""FlexAttention (the CUDA path of pointwise score biases) against the chunked path, on CPU (compiled)."""

import pytest
import torch

from posenc.attention import attention, flex_causal
from posenc.encodings.bias import alibi_slopes, distance_bias
from posenc.encodings.composite import sum_biases
from posenc.encodings.forget import forget_bias, log_forget_cumsum


def biases(logits, T):
    pos = torch.arange(T)
    alibi, forget = distance_bias(alibi_slopes(2), pos), forget_bias(log_forget_cumsum(logits))
    return {"alibi": alibi, "forget": forget, "alibi+forget": sum_biases([alibi, forget])}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["alibi", "forget", "alibi+forget"])
def test_flex_attention_matches_the_chunked_path(name):
    """Values (the CUDA path is evaluation-only; FlexAttention has no backward on CPU)."""
    torch.manual_seed(0)
    B, H, T, D = 2, 2, 256, 16
    q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
    bias = biases(torch.randn(B, H, T) + 2, T)[name]
    with torch.no_grad():
        ref = attention(q, k, v, bias=bias, block_size=64)
        got = flex_causal(q, k, v, bias.at, D**-0.5)
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4)
