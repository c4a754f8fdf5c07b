"""A counter-based uniform draw: u = hash(seed, draw, row, position, head, block).

The random accumulated rotations need i.i.d. U[-1, 1) steps that are
- the same for a position whatever the sequence length (decoding token by token
  sees the steps the parallel forward used),
- a pure function of (global batch row, training draw), so data-parallel ranks
  draw their slice of one global draw and a resumed run draws what an
  uninterrupted one would,
- computed by tensor ops with no Python loop over rows and no host sync (the
  draw counter stays a tensor, so ``torch.compile`` sees no graph break).
A stateful generator gives none of these, so each value is a hash of its
coordinates: a 32-bit integer mixer (Wellons' "hash prospector" 2-round
xorshift-multiply) applied along the chain seed -> draw -> row -> position ->
(head, block). Every product stays below 2^63 (a 32-bit value times a
31-bit constant), so int64 tensor arithmetic never overflows; the top 24 bits
give a float32 in [0, 1) exactly.
"""

from __future__ import annotations

import torch

MASK = 0xFFFFFFFF
M1, M2 = 0x21F0AAAD, 0x735A2D97  # the mixer's multipliers, both < 2^31
GOLDEN = 0x61C88647  # odd stride < 2^31 between consecutive counters (2^32 (1 - 1/golden ratio))


def mix32(x: torch.Tensor) -> torch.Tensor:
    """The 32-bit mixer on int64 tensors holding values in [0, 2^63): returns values in [0, 2^32)."""
    x = x & MASK  # a new tensor: the in-place steps below never touch the caller's
    x.bitwise_xor_(x >> 16).mul_(M1).bitwise_and_(MASK)
    x.bitwise_xor_(x >> 15).mul_(M2).bitwise_and_(MASK)
    return x.bitwise_xor_(x >> 15)


def mix32_int(x: int) -> int:
    """``mix32`` on a Python integer (any size: only its low 32 bits are mixed)."""
    x &= MASK
    x = ((x ^ (x >> 16)) * M1) & MASK
    x = ((x ^ (x >> 15)) * M2) & MASK
    return x ^ (x >> 15)


def seed_key(seed: int) -> int:
    """A 32-bit key from a non-negative seed of any size (its high bits folded in)."""
    return mix32_int(mix32_int(seed) + (seed >> 32))


def row_keys(seed: int, draw: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The chain's key after seed -> draw -> row: (B, 1) int64 in [0, 2^32); arguments as ``counter_uniform``."""
    key = mix32(mix32(draw.to(torch.int64) + seed_key(seed) * GOLDEN) + 1)
    return mix32(key + rows.to(key.device)[:, None] * GOLDEN)


def row_key_int(seed: int, draw: int, row: int) -> int:
    """``row_keys`` of one fixed (draw, row) with Python integers: a key computed once (the evaluation draw)."""
    return mix32_int(mix32_int(mix32_int(draw + seed_key(seed) * GOLDEN) + 1) + row * GOLDEN)


def uniform_at(per_row: torch.Tensor, pos: torch.Tensor, n_head: int, n_blocks: int) -> torch.Tensor:
    """The rest of the chain, position -> (head, block), from ``row_keys`` (B, 1) int64 and positions (T,) int64, or
    (B|1, T) for positions per row (a left-padded batch): (B, H, T, n_blocks) float32."""
    pos = pos.to(per_row.device)
    per_pos = mix32(per_row + (pos[None, :] if pos.dim() == 1 else pos) * GOLDEN)  # (B, T)
    lane = torch.arange(n_head * n_blocks, device=per_row.device) * GOLDEN
    bits = mix32(per_pos[..., None] + lane)  # (B, T, H * n_blocks)
    u = (bits >> 8).to(torch.float32) * 2.0**-23 - 1.0
    return u.view(*per_pos.shape, n_head, n_blocks).transpose(1, 2)


def counter_uniform(
    seed: int, draw: torch.Tensor, rows: torch.Tensor, pos: torch.Tensor, n_head: int, n_blocks: int
) -> torch.Tensor:
    """U[-1, 1) per (row, head, position, block): (len(rows), H, len(pos), n_blocks) float32.

    seed: int >= 0; draw: int64 scalar tensor in [0, 2^31) (the training draw counter);
    rows: (B,) int64 global batch rows and pos: (T,) int64 absolute positions, both in [0, 2^31).
    """
    return uniform_at(row_keys(seed, draw, rows), pos, n_head, n_blocks)


def counter_uniform_naive(seed: int, draw: int, row: int, pos: int, head: int, block: int, n_blocks: int) -> float:
    """Reference: one value of ``counter_uniform`` with Python integers (no overflow by construction)."""
    key = mix32_int(mix32_int(draw + seed_key(seed) * GOLDEN) + 1)
    bits = mix32_int(mix32_int(mix32_int(key + row * GOLDEN) + pos * GOLDEN) + (head * n_blocks + block) * GOLDEN)
    return (bits >> 8) * 2.0**-23 - 1.0
