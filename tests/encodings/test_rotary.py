"""Accumulated rotations and RoPE against naive references built from explicit transports."""

import math

import numpy as np
import pytest
import torch

from posenc import encodings
from posenc.attention import attention, half_to_adjacent, naive_attention, rotate, rotate_shared
from posenc.encodings.accumulated import accumulate
from posenc.encodings.base import Dims, Inputs
from posenc.rope import rope_inv_freq


def block_rotation(angles: torch.Tensor) -> torch.Tensor:
    """(D/2,) angles -> (D, D) matrix rotating pairs (x_i, x_{i+D/2}) by +angle (half pairing)."""
    h = angles.shape[0]
    R = torch.zeros(2 * h, 2 * h, dtype=angles.dtype)
    c, s = torch.cos(angles), torch.sin(angles)
    idx = torch.arange(h)
    R[idx, idx], R[idx, idx + h], R[idx + h, idx], R[idx + h, idx + h] = c, -s, s, c
    return R


def naive_transport_attention(q, k, v, theta, rotate_v):
    """Reference: P(j->i) = M_{j+1} ... M_i with M_t = R(-theta_t), built for every pair.

    q, k, v: (T, D); theta: (T, D/2). Returns (scores (T, T), output (T, D)).
    """
    T, D = q.shape
    steps = [block_rotation(-theta[t]) for t in range(T)]
    P = [[None] * T for _ in range(T)]
    for i in range(T):
        acc = torch.eye(D, dtype=q.dtype)
        P[i][i] = acc
        for j in range(i - 1, -1, -1):  # P(j->i) = M_{j+1} P(j+1->i)
            acc = steps[j + 1] @ acc
            P[i][j] = acc
    scores = torch.full((T, T), float("-inf"), dtype=q.dtype)
    for i in range(T):
        for j in range(i + 1):
            scores[i, j] = q[i] @ (P[i][j] @ k[j]) / math.sqrt(D)
    a = torch.softmax(scores, dim=-1)
    out = torch.stack([sum(a[i, j] * (P[i][j] @ v[j] if rotate_v else v[j]) for j in range(i + 1)) for i in range(T)])
    return scores, out


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize("rotate_v", [False, True])
def test_accumulated_fast_path_equals_explicit_transports(dtype, tol, rotate_v):
    T, D = 7, 6
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(T, D, generator=g, dtype=dtype) for _ in range(3))
    theta = (torch.rand(T, D // 2, generator=g, dtype=torch.float64) * 2 - 1) * 1.3
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, theta)]
    fast = attention(
        *(t[None, None] for t in leaves[:3]), phases=accumulate(leaves[3], dtype=dtype)[None, None], rotate_v=rotate_v
    )[0, 0]
    ref_leaves = [t.clone().requires_grad_(True) for t in (q, k, v, theta.to(dtype))]
    _, ref = naive_transport_attention(*ref_leaves, rotate_v)
    assert torch.allclose(fast, ref, atol=tol, rtol=0)
    w = torch.randn(T, D, generator=g, dtype=dtype)
    (fast * w).sum().backward()
    (ref * w).sum().backward()
    for a, b in zip(leaves, ref_leaves):  # q, k, v and the step angles
        assert torch.allclose(a.grad.to(dtype), b.grad, atol=tol * 10, rtol=0)


def test_accumulated_scores_equal_explicit_transports():
    T, D = 6, 4
    q, k, v = (torch.randn(T, D, dtype=torch.float64) for _ in range(3))
    theta = torch.rand(T, D // 2, dtype=torch.float64) * 3
    scores, _ = naive_transport_attention(q, k, v, theta, False)
    phi = accumulate(theta, dtype=torch.float64)
    fast = (rotate(q[None, None], phi) @ rotate(k[None, None], phi).transpose(-1, -2))[0, 0] / math.sqrt(D)
    assert torch.allclose(fast.tril(), scores.masked_fill(scores.isinf(), 0), atol=1e-10)


def test_rope_is_accumulated_rotation_with_constant_step():
    dims = Dims(n_head=2, head_dim=8, d_model=16, vocab_size=256, train_length=16)
    T = 40
    inp = Inputs(torch.zeros(1, T, 16), torch.arange(T), torch.zeros(1, T, dtype=torch.long))
    rope_phi = encodings.get("rope", dims).phases(inp)
    const = rope_inv_freq(8)[None, :].expand(T, 4)
    acc_phi = accumulate(const)  # Phi_t = (t+1) omega: a constant offset, the same scores
    q, k, v = (torch.randn(1, 2, T, 8) for _ in range(3))
    assert torch.allclose(
        attention(q, k, v, phases=rope_phi), attention(q, k, v, phases=acc_phi[None, None]), atol=1e-5
    )
    assert not torch.allclose(attention(q, k, v, phases=rope_phi), attention(q, k, v), atol=1e-3)


def test_half_and_adjacent_pairing_agree_after_permutation():
    T, D = 20, 8
    q, k, v = (torch.randn(1, 2, T, D) for _ in range(3))
    phi = (torch.arange(T, dtype=torch.float64)[:, None] * rope_inv_freq(D)).float()[None, None]
    out_half = attention(q, k, v, phases=phi, pairing="half")
    out_adj = attention(half_to_adjacent(q), half_to_adjacent(k), v, phases=phi, pairing="adjacent")
    assert torch.allclose(out_half, out_adj, atol=1e-6)
    rot = half_to_adjacent(rotate(q, phi, "half"))
    assert torch.allclose(rot, rotate(half_to_adjacent(q), phi, "adjacent"), atol=1e-6)
    assert not torch.allclose(attention(q, k, v, phases=phi, pairing="adjacent"), out_half, atol=1e-3)


def test_phase_precision_at_one_million_tokens():
    T = 1_000_000
    omega = 0.9
    theta = (torch.rand(T, 1, generator=torch.Generator().manual_seed(3)) * 2 * omega).float()
    phi = accumulate(theta[None], dim=1)[0, :, 0].double()
    exact = torch.cumsum(theta[:, 0].double(), 0)  # float64 sum of the float32 steps: error ~1e-10 rad
    pairs = [(T - 1, 0), (T - 1, T - 2), (777_777, 123_456), (500_000, 499_000)]
    for i, j in pairs:
        got = torch.remainder(phi[i] - phi[j], 2 * math.pi)
        want = torch.remainder(exact[i] - exact[j], 2 * math.pi)
        err = abs(float(torch.remainder(got - want + math.pi, 2 * math.pi) - math.pi))
        assert err < 1e-5, (i, j, err)
    naive32 = torch.cumsum(theta[:, 0], 0)  # what accumulating in float32 would give
    err32 = abs(float(naive32[T - 1] - naive32[0]) - float(exact[T - 1] - exact[0]))
    assert err32 > 1e-3  # the float64 accumulation is needed


@pytest.mark.parametrize("spec", ["acc-token-qkv", "acc-token-qkv:center=rope"])
def test_accumulated_module_phases_are_prefix_sums_of_its_steps(spec):
    dims = Dims(n_head=2, head_dim=8, d_model=16, vocab_size=256, train_length=16)
    enc = encodings.get(spec, dims)
    tokens = torch.randint(0, 256, (2, 30))
    inp = Inputs(torch.zeros(2, 30, 16), torch.arange(30), tokens)
    theta = enc.center_b + enc.width_b * enc.token_u[tokens].transpose(1, 2)
    assert torch.allclose(enc.phases(inp), accumulate(theta), atol=1e-6)
    assert enc.rotate_v
    if spec == "acc-token-qkv":  # Example 1: U[-1, 1] on every block, beta = sin(1) / 1
        assert (
            float(theta.min()) >= -1
            and float(theta.max()) <= 1
            and float(theta.min()) < -0.5 < 0.5 < float(theta.max())
        )
        np.testing.assert_allclose(enc.spectral_gap().numpy(), math.sin(1.0), rtol=1e-7)
    else:  # drift: steps lie in [0, 2 omega_b], beta = |sin(omega)/omega|
        assert float(theta.min()) >= 0 and bool((theta <= 2 * enc.center_b + 1e-7).all())
        assert torch.allclose(enc.spectral_gap(), (torch.sin(enc.width_b.double()) / enc.width_b.double()).abs())


def test_random_steps_fresh_in_training_fixed_in_eval():
    dims = Dims(n_head=1, head_dim=4, d_model=8, vocab_size=256, train_length=16)
    enc = encodings.get("acc-rand-qk", dims)
    inp = Inputs(torch.zeros(1, 10, 8), torch.arange(10), torch.zeros(1, 10, dtype=torch.long))
    enc.train()
    a, b = enc.phases(inp), enc.phases(inp)
    assert not torch.allclose(a, b)
    enc.eval()
    assert torch.equal(enc.phases(inp), enc.phases(inp))


@pytest.mark.parametrize("pairing", ["half", "adjacent"])
@pytest.mark.parametrize("sign", [1, -1])
@pytest.mark.parametrize("phi_shape", [(2, 3, 9, 4), (1, 1, 9, 4)])
def test_rotate_shared_equals_autograd_reference(pairing, sign, phi_shape):
    """The analytic-gradient rotation (fast path) against rotate() with autograd through cos/sin."""
    g = torch.Generator().manual_seed(2)
    base = torch.randn(2, 9, 3, 3, 8, generator=g, dtype=torch.float64)
    phi = (torch.rand(phi_shape, generator=g, dtype=torch.float64) * 20).requires_grad_(True)
    x = base.permute(2, 0, 3, 1, 4)[1].detach().requires_grad_(True)  # a strided view, as the layer's q/k/v
    x_ref, phi_ref = x.detach().clone().requires_grad_(True), phi.detach().clone().requires_grad_(True)
    y = rotate_shared(x, phi, torch.cos(phi), torch.sin(phi), pairing, sign)
    y_ref = rotate(x_ref, sign * phi_ref, pairing)
    assert torch.allclose(y, y_ref, atol=1e-12, rtol=0)
    w = torch.randn(y.shape, generator=g, dtype=torch.float64)
    (y * w).sum().backward()
    (y_ref * w).sum().backward()
    assert torch.allclose(x.grad, x_ref.grad, atol=1e-12, rtol=0)
    assert torch.allclose(phi.grad, phi_ref.grad, atol=1e-12, rtol=0)


def test_rotate_shared_rejects_what_it_cannot_rotate():
    x, phi = torch.randn(1, 2, 5, 8), torch.rand(3, 2, 5, 4)  # phases would enlarge x
    with pytest.raises(ValueError, match=r"phases \(3, 2, 5, 4\) do not broadcast to the feature pairs \(1, 2, 5, 4\)"):
        rotate_shared(x, phi, phi.cos(), phi.sin())
    with pytest.raises(ValueError, match="sign"):
        rotate_shared(x, phi[:1], phi[:1].cos(), phi[:1].sin(), sign=2)


def test_naive_attention_matches_sdpa_path():
    q, k, v = (torch.randn(2, 3, 33, 8, dtype=torch.float64) for _ in range(3))
    assert torch.allclose(attention(q, k, v), naive_attention(q, k, v), atol=1e-10)
