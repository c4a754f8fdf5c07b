"""Step distributions of the stylized model: i.i.d. random steps M_t in d x d.

A route j -> i multiplies n = i - j steps, P_n = M_1 ... M_n (paper "Why do
accumulated transformations extrapolate?", arXiv 2606.24975, Sec. 2.2, eq. 6).
Every distribution here knows E[M] exactly, so E[P_n] = E[M]^n (i.i.d. steps,
Sec. 3 / Theorem 1) and the spectral gap beta = ||E[M]||_op are closed forms:

- ``so2:<a>``       block rotations, angles i.i.d. U[-a, a] per block:
                    E[M] = (sin a / a) I (paper Example 1).
- ``so2-drift[:b]`` angles U[0, 2 omega_b], omega_b = b^(-2b'/d) (RoPE mean, with
                    jitter): block b has E[M_b] = e^{i omega_b} sin(omega_b)/omega_b.
- ``householder``   H = I - beta w w^T, w uniform on S^{d-1}, beta ~ U(0, 2]:
                    E[M] = (1 - E[beta]/d) I = (1 - 1/d) I (paper Example 2; PaTH
                    steps; orthogonal only at beta = 2, a contraction otherwise).
- ``haar``          Haar-random O(d): E[M] = 0.

Tensors are float64; vectors are (samples, d), rotations act on adjacent pairs
(x_{2b}, x_{2b+1}), b = 0 .. d/2 - 1.
"""

from __future__ import annotations

import math

import torch

from posenc.attention import rotate
from posenc.errors import PosencError
from posenc.rope import rope_inv_freq

DTYPE = torch.float64
KNOWN = "so2:<a>, so2-drift[:base], householder, haar"
_STEP_CHUNK = 16  # steps summed per tensor op: bounds memory at samples x blocks x 16


def phasor_mean(phi: torch.Tensor, dim) -> torch.Tensor:
    """mean of exp(i phi) over ``dim``, complex128 (cos/sin: faster than complex exp on CPU)."""
    return torch.complex(torch.cos(phi).mean(dim), torch.sin(phi).mean(dim))


def unit_vectors(samples: int, d: int, gen: torch.Generator) -> torch.Tensor:
    """i.i.d. uniform points on S^{d-1}: (samples, d) float64."""
    g = torch.randn(samples, d, generator=gen, dtype=DTYPE)
    return g / g.norm(dim=-1, keepdim=True)


class StepDist:
    """An i.i.d. step distribution with ||M||_op <= 1 and an exact E[M]."""

    name: str
    d: int

    def mean_step(self) -> torch.Tensor:
        """E[M]: (d, d) float64, exact."""
        raise NotImplementedError

    def beta(self) -> float:
        """Spectral gap beta = ||E[M]||_op (so ||E[P_n]||_op <= beta^n)."""
        return float(torch.linalg.matrix_norm(self.mean_step(), ord=2))

    def mean_products(self, n_max: int, samples: int, gen: torch.Generator) -> torch.Tensor:
        """Monte Carlo mean of P_n over ``samples`` routes, n = 0..n_max: (n_max+1, d, d)."""
        raise NotImplementedError

    def apply(self, k: torch.Tensor, n: int, gen: torch.Generator) -> torch.Tensor:
        """P_n k for k (samples, d), a fresh route per row: (samples, d)."""
        raise NotImplementedError


class SO2Steps(StepDist):
    """Block-diagonal rotations; subclasses give the per-block angle law."""

    def angles(self, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
        """i.i.d. step angles (*shape, d/2)."""
        raise NotImplementedError

    def block_means(self) -> torch.Tensor:
        """E[exp(i theta_b)] per block: (d/2,) complex128."""
        raise NotImplementedError

    def mean_step(self) -> torch.Tensor:
        return block_matrix(self.block_means())

    def route_phases(self, n: int, samples: int, gen: torch.Generator) -> torch.Tensor:
        """Accumulated angle of n steps per block: (samples, d/2)."""
        phi = torch.zeros(samples, self.d // 2, dtype=DTYPE)
        for start in range(0, n, _STEP_CHUNK):
            phi += self.angles((samples, min(_STEP_CHUNK, n - start)), gen).sum(1)
        return phi

    def mean_products(self, n_max, samples, gen):
        phi = torch.zeros(samples, self.d // 2, dtype=DTYPE)
        means = torch.ones(n_max + 1, self.d // 2, dtype=torch.complex128)
        for n in range(1, n_max + 1):
            phi += self.angles((samples,), gen)
            means[n] = phasor_mean(phi, 0)
        return block_matrix(means)

    def apply(self, k, n, gen):
        return rotate(k, self.route_phases(n, k.shape[0], gen), "adjacent")


class SO2Uniform(SO2Steps):
    """Angles U[-a, a], i.i.d. over tokens and blocks (paper Example 1)."""

    def __init__(self, d: int, a: float):
        self.name, self.d, self.a = f"so2:{a:g}", d, a

    def angles(self, shape, gen):
        u = torch.rand(*shape, self.d // 2, generator=gen, dtype=DTYPE)
        return self.a * (2.0 * u - 1.0)

    def block_means(self):
        beta = math.sin(self.a) / self.a
        return torch.full((self.d // 2,), beta, dtype=torch.complex128)


class SO2Drift(SO2Steps):
    """Angles U[0, 2 omega_b]: RoPE's frequency as the mean step, with jitter (the drift variant of
    ``posenc.encodings.accumulated``)."""

    def __init__(self, d: int, base: float = 10000.0):
        self.name = "so2-drift" if base == 10000.0 else f"so2-drift:{base:g}"
        self.d, self.base = d, base
        self.omega = rope_inv_freq(d, base)

    def angles(self, shape, gen):
        u = torch.rand(*shape, self.d // 2, generator=gen, dtype=DTYPE)
        return 2.0 * self.omega * u

    def block_means(self):
        w = self.omega
        return torch.polar(torch.sin(w) / w, w)


class Householder(StepDist):
    """PaTH-like steps H = I - beta w w^T, w uniform on the sphere, beta ~ U(0, 2]."""

    def __init__(self, d: int):
        self.name, self.d = "householder", d

    def mean_step(self):
        # E[w w^T] = I/d and E[beta] = 1
        return (1.0 - 1.0 / self.d) * torch.eye(self.d, dtype=DTYPE)

    def _draw(self, samples, gen):
        w = unit_vectors(samples, self.d, gen)
        b = 2.0 * (1.0 - torch.rand(samples, generator=gen, dtype=DTYPE))  # (0, 2]
        return w, b

    def mean_products(self, n_max, samples, gen):
        p = torch.eye(self.d, dtype=DTYPE).expand(samples, -1, -1).clone()
        means = _mean_buffer(n_max, self.d)
        for n in range(1, n_max + 1):
            w, b = self._draw(samples, gen)
            p -= b[:, None, None] * (p @ w[:, :, None]) * w[:, None, :]  # P <- P H
            means[n] = p.mean(0)
        return means

    def apply(self, k, n, gen):
        # i.i.d. steps: applying them in either order gives the same law of P_n k
        for _ in range(n):
            w, b = self._draw(k.shape[0], gen)
            k = k - (b * (k * w).sum(-1))[:, None] * w
        return k

    def second_moment(self, q: torch.Tensor, k: torch.Tensor, n: int) -> float:
        """E[(q^T P_n k)^2] for unit k, exact.

        E[P_n k k^T P_n^T] stays in span{k k^T, I}: with A = a k k^T + b I,
        E[H A H] = A - 2 E[beta] A / d + E[beta^2] (2A + tr(A) I) / (d(d+2))
        (isotropic fourth moment of w), E[beta] = 1, E[beta^2] = 4/3.
        """
        d, eb, eb2 = self.d, 1.0, 4.0 / 3.0
        c = eb2 / (d * (d + 2))
        a, b = 1.0, 0.0
        for _ in range(n):
            a, b = a * (1 - 2 * eb / d + 2 * c), b * (1 - 2 * eb / d + 2 * c) + c * (a + b * d)
        return a * float(q @ k) ** 2 + b * float(q @ q)


class Haar(StepDist):
    """Haar-random orthogonal steps: E[M] = 0, so every route with n >= 1 is mixed."""

    def __init__(self, d: int):
        self.name, self.d = "haar", d

    def mean_step(self):
        return torch.zeros(self.d, self.d, dtype=DTYPE)

    def sample(self, samples: int, gen: torch.Generator) -> torch.Tensor:
        """Haar O(d) via QR with sign fix (Mezzadri 2007): (samples, d, d)."""
        z = torch.randn(samples, self.d, self.d, generator=gen, dtype=DTYPE)
        q, r = torch.linalg.qr(z)
        return q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))[:, None, :]

    def mean_products(self, n_max, samples, gen):
        p = torch.eye(self.d, dtype=DTYPE).expand(samples, -1, -1)
        means = _mean_buffer(n_max, self.d)
        for n in range(1, n_max + 1):
            p = p @ self.sample(samples, gen)
            means[n] = p.mean(0)
        return means

    def apply(self, k, n, gen):
        # U k is uniform on the sphere of radius |k| for Haar U, whatever k is
        return k if n == 0 else k.norm(dim=-1, keepdim=True) * unit_vectors(k.shape[0], self.d, gen)


def _mean_buffer(n_max: int, d: int) -> torch.Tensor:
    """(n_max+1, d, d) output with E[P_0] = I filled in. Preallocated: appending small
    tensors between the large per-step temporaries fragments the heap (+10 MB per step)."""
    means = torch.empty(n_max + 1, d, d, dtype=DTYPE)
    means[0] = torch.eye(d, dtype=DTYPE)
    return means


def block_matrix(z: torch.Tensor) -> torch.Tensor:
    """Block-diagonal real matrices [[Re, -Im], [Im, Re]] from z (..., d/2): (..., d, d)."""
    d = 2 * z.shape[-1]
    out = torch.zeros(*z.shape[:-1], d, d, dtype=DTYPE)
    out[..., 0::2, 0::2] = torch.diag_embed(z.real)
    out[..., 0::2, 1::2] = torch.diag_embed(-z.imag)
    out[..., 1::2, 0::2] = torch.diag_embed(z.imag)
    out[..., 1::2, 1::2] = torch.diag_embed(z.real)
    return out


def block_norms(m: torch.Tensor) -> torch.Tensor:
    """Operator norm of each 2x2 block [[c, -s], [s, c]] of m (..., d, d): (..., d/2)."""
    return torch.hypot(m[..., 0::2, 0::2].diagonal(dim1=-2, dim2=-1), m[..., 1::2, 0::2].diagonal(dim1=-2, dim2=-1))


def parse_dist(spec: str, d: int) -> StepDist:
    """Build a step distribution from ``so2:<a>``, ``so2-drift[:base]``, ``householder``, ``haar``."""
    name, _, arg = spec.partition(":")
    if not isinstance(d, int) or d < 2:
        raise PosencError(f"dimension must be an integer >= 2, got {d!r}")
    if name in ("so2", "so2-drift") and d % 2:
        raise PosencError(f"{spec}: SO(2) blocks need an even dimension, got d={d}")
    if name == "so2":
        a = _number(spec, arg)
        if not a > 0:
            raise PosencError(f"{spec}: angle half-width a must be > 0")
        return SO2Uniform(d, a)
    if name == "so2-drift":
        base = _number(spec, arg) if arg else 10000.0
        if not base > 1:
            raise PosencError(f"{spec}: RoPE base must be > 1")
        return SO2Drift(d, base)
    if name == "householder" and not arg:
        return Householder(d)
    if name == "haar" and not arg:
        return Haar(d)
    raise PosencError(f"unknown step distribution {spec!r}; known: {KNOWN}")


def _number(spec: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise PosencError(f"{spec}: expected a number after ':'") from None
    if not math.isfinite(value):
        raise PosencError(f"{spec}: expected a finite number")
    return value
