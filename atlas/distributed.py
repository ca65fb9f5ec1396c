"""Process groups from `torchrun`'s environment: one code path for 1 process and for N.

`torchrun --nproc_per_node N -m atlas train CONFIG` sets RANK / WORLD_SIZE / LOCAL_RANK /
MASTER_ADDR / MASTER_PORT; plain `atlas train` sets none of them and runs as rank 0 of 1.
SLURM users launch `torchrun` with its own rendezvous (`--rdzv-backend c10d`); nothing here
reads SLURM variables. NCCL on GPUs, gloo on CPUs.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistributedContext:
    """Who this process is: `rank` of `world_size`, on `device`."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def is_main(self) -> bool:
        """Rank 0 writes checkpoints, logs and evaluation outputs."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        """Whether there is more than one process."""
        return self.world_size > 1

    def barrier(self) -> None:
        """Wait for every rank (no-op for one process)."""
        if self.enabled:
            dist.barrier()


def init_distributed() -> DistributedContext:
    """Join the process group that `torchrun` describes in the environment (or run alone)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return DistributedContext(rank=rank, world_size=world_size, local_rank=local_rank, device=device)


def current_context() -> DistributedContext:
    """This process's place in the default process group as it stands (one process of one when
    there is none): for code that is handed no context, such as building a model from its config."""
    if not (dist.is_available() and dist.is_initialized()):
        return DistributedContext()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    return DistributedContext(
        rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local_rank, device=device
    )


def agree_on_rank0(value: bool) -> bool:
    """Rank 0's `value` on every rank (a file check that must not differ between ranks)."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return bool(box[0])


def shutdown(context: DistributedContext) -> None:
    """Leave the process group (when this process created one)."""
    if context.enabled and dist.is_initialized():
        # a rank that tears gloo down while a peer is still in its last collective can kill that
        # peer ("terminate called without an active exception"): leave together
        dist.barrier()
        dist.destroy_process_group()


def no_sync_unless(last: bool, module) -> contextlib.AbstractContextManager:
    """DDP's `no_sync()` for every micro-batch but the last of an accumulation window."""
    if last or not hasattr(module, "no_sync"):
        return contextlib.nullcontext()
    return module.no_sync()


def average_gradients(parameters, context: DistributedContext) -> None:
    """Average the gradients of `parameters` over the ranks, as DDP would, for parameters that
    no DDP or DeepSpeed engine reduces (the retriever when DeepSpeed holds the reader).

    A parameter whose gradient is None on every rank stays None (the optimizer skips it, as
    with DDP); one that has a gradient on some ranks only counts zeros on the others.
    """
    if not context.enabled:
        return
    parameters = [p for p in parameters if p.requires_grad]
    if not parameters:
        return
    present = torch.tensor([p.grad is not None for p in parameters], dtype=torch.float32, device=context.device)
    dist.all_reduce(present)
    used = [p for p, n in zip(parameters, present.tolist()) if n > 0]
    if not used:
        return
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in used])
    dist.all_reduce(flat)
    flat /= context.world_size
    offset = 0
    for p in used:
        p.grad = flat[offset : offset + p.numel()].view_as(p).clone()
        offset += p.numel()
