"""FlexAttention (the CUDA path of pointwise score biases) against the chunked path, on CPU (compiled)."""

import pytest
import torch

from posenc.attention import attention, flex_causal
from posenc.encodings.bias import alibi_slopes, distance_bias
from posenc.encodings.forget import forget_bias, log_forget_cumsum


def biases(logits, T):
    pos = torch.arange(T)
    alibi, forget = distance_bias(alibi_slopes(2), pos), forget_bias(log_forget_cumsum(logits))

    def both(qs, qe, ks, ke):
        return alibi(qs, qe, ks, ke) + forget(qs, qe, ks, ke)

    both.at = lambda b, h, qi, ki: alibi.at(b, h, qi, ki) + forget.at(b, h, qi, ki)
    return {"alibi": alibi, "forget": forget, "alibi+forget": both}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["alibi", "forget", "alibi+forget"])
def test_flex_attention_matches_the_chunked_path(name):
    torch.manual_seed(0)
    B, H, T, D = 2, 2, 256, 16
    q, k, v = (torch.randn(B, H, T, D, requires_grad=True) for _ in range(3))
    logits = (torch.randn(B, H, T) + 2).requires_grad_(True)
    grads = []
    for path in ("chunked", "flex"):
        bias = biases(logits, T)[name]
        out = attention(q, k, v, bias=bias, block_size=64) if path == "chunked" else flex_causal(q, k, v, bias.at, D**-0.5)
        w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        g = torch.autograd.grad((out * w).sum(), (q, k, v, logits), allow_unused=True)
        grads.append((out.detach(), g))
    (ref, gref), (got, ggot) = grads
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4)
    for a, b in zip(ggot, gref):
        if b is not None and a is not None:
            torch.testing.assert_close(a, b, atol=5e-5, rtol=1e-3)
    assert all(a is not None for a in ggot[:3])
