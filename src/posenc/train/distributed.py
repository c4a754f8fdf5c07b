"""Data-parallel helpers: one process per device under ``torchrun``, or a single process.

``setup()`` reads torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``),
initialises the process group (NCCL on CUDA, gloo on CPU) and picks the device.
Each rank trains on the rows ``shard.rows(batch_size)`` of the global batch;
DistributedDataParallel averages gradients over ranks, so with equal shards and
a per-rank loss that is the mean over the rank's rows, one step updates the
weights exactly as a single process on the whole global batch would (up to the
order of floating-point sums).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import inspect
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from posenc.errors import PosencError


@dataclasses.dataclass(frozen=True)
class Shard:
    """This process's place in the job: ``rank`` of ``world`` processes, on ``device``."""

    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        """Rank 0: the only process that writes checkpoints, logs and progress bars."""
        return self.rank == 0

    def rows(self, batch_size: int) -> slice:
        """This rank's rows of a global batch of ``batch_size`` (equal shards).

        Raises PosencError when ``batch_size`` is not a multiple of the world size.
        """
        if batch_size % self.world:
            raise PosencError(f"batch_size {batch_size} is not divisible by the {self.world} processes")
        per = batch_size // self.world
        return slice(self.rank * per, (self.rank + 1) * per)

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        """Mean of a tensor over ranks (a copy; ``x`` itself on a single process)."""
        if self.world == 1:
            return x
        x = x.detach().clone()
        dist.all_reduce(x, op=dist.ReduceOp.SUM)  # gloo has no AVG
        return x / self.world

    @contextlib.contextmanager
    def main_first(self):
        """Rank 0 runs the block first (e.g. building a token cache), the other ranks after it."""
        if not self.is_main:
            dist.barrier()
        yield
        if self.is_main and self.world > 1:
            dist.barrier()

    def wait_all(self) -> None:
        """Every rank waits here for the others (no-op on a single process): ranks leave a job together, so none
        tears its process group down while rank 0 still writes the run's files (a gloo rank whose peers are still
        busy can abort at exit)."""
        if self.world > 1:
            dist.barrier()

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on any rank (a collective stop decision)."""
        if self.world == 1:
            return flag
        t = torch.tensor([int(flag)], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())


def rank() -> int:
    """This process's rank under torchrun (``RANK``), 0 on a single process."""
    return int(os.environ.get("RANK", "0"))


DEVICE_TYPES = ("cpu", "cuda", "mps")  # what --device takes: cpu, cuda, cuda:N, mps


def world_size() -> int:
    """Processes of the run under torchrun (``WORLD_SIZE``), 1 on a single process."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def check_device(name: str) -> torch.device:
    """``name`` (cpu, cuda, cuda:N, mps) as a torch device that exists here; PosencError (one line) for a bad name,
    another device type or an absent device."""
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise PosencError(f"unknown device {name!r} (e.g. cpu, cuda, cuda:1, mps)") from None
    if device.type not in DEVICE_TYPES:
        raise PosencError(f"unsupported device {name!r}: give cpu, cuda, cuda:N or mps")
    if device.type == "cuda" and not (torch.cuda.is_available() and (device.index or 0) < torch.cuda.device_count()):
        raise PosencError(
            f"device {name!r} is not available here "
            f"(torch {torch.__version__}, cuda available: {torch.cuda.is_available()}, "
            f"{torch.cuda.device_count()} GPU(s))"
        )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise PosencError(f"device {name!r} is not available here (torch {torch.__version__}: no MPS)")
    return device


def default_device() -> torch.device:
    """CUDA when a GPU is present, else CPU."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def setup(device: torch.device | None = None) -> Shard:
    """The process's shard on ``device`` (None: :func:`default_device`); under torchrun (``WORLD_SIZE`` > 1) joins
    the process group.

    Backend: NCCL with one GPU per process (``LOCAL_RANK``; a single process keeps a given ``cuda:N``) when the
    device is CUDA, gloo otherwise. Idempotent: a second call returns the same shard.
    """
    world = world_size()
    device = default_device() if device is None else device
    if device.type == "cuda":
        index = device.index if world == 1 and device.index is not None else int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timedelta(minutes=30))
    return Shard(rank(), world, device)


def teardown() -> None:
    """Leave the process group (no-op on a single process). Collects garbage first: DistributedDataParallel's reducer
    sits in a reference cycle and holds gloo work objects; left to the interpreter's exit, their tensors need the GIL
    while it is torn down and the rank aborts ("terminate called without an active exception", SIGABRT: one CI run's
    torchrun test; pytorch/pytorch#179291 describes the mechanism)."""
    if dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


def wrap(model: torch.nn.Module, shard: Shard) -> torch.nn.Module:
    """``model`` in DistributedDataParallel when there is more than one process.

    Buffers are not broadcast: every buffer (e.g. the random-draw counter of
    accumulated rotations) is a deterministic function of (seed, step), the same
    on every rank.
    """
    if shard.world == 1:
        return model
    ddp = torch.nn.parallel.DistributedDataParallel
    # torch >= 2.13 renamed broadcast_buffers (syncing them once at init is harmless: they agree)
    sync = (
        "forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(ddp).parameters else "broadcast_buffers"
    )
    ids = [shard.device.index] if shard.device.type == "cuda" else None
    return ddp(model, device_ids=ids, **{sync: False})


def set_batch_rows(model: torch.nn.Module, rows: slice) -> None:
    """Tell every encoding with per-row random draws which global rows this rank holds.

    Modules that define ``batch_row_offset`` (accumulated random rotations) draw
    row r of the global batch from a generator seeded by (seed, draw, r), so each
    rank draws exactly its slice of the single-process draw.
    """
    for m in model.modules():
        if hasattr(m, "batch_row_offset"):
            m.batch_row_offset = rows.start or 0
