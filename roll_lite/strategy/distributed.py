"""Process-group setup: gloo on CPU, nccl on CUDA; a one-process group when run alone."""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def training_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    return torch.device("cpu")


def resolve_device(device: torch.device | str | None) -> torch.device:
    """A concrete device: 'cuda' without an index means this process's GPU (LOCAL_RANK), as nccl needs."""
    if device is None:
        return training_device()
    resolved = torch.device(device)
    if resolved.type == "cuda" and resolved.index is None:
        return training_device()
    return resolved


def open_group_store(host: str, world_size: int) -> dist.TCPStore:
    """Rank 0's rendezvous store, listening from now on a port the OS picks (`.port`). Choosing a free
    port and listening on it later (free_port) leaves a window in which another process can take it:
    the group's start then fails with EADDRINUSE."""
    return dist.TCPStore(host, 0, world_size, is_master=True, timeout=default_pg_timeout, wait_for_workers=False)


def join_group_store(host: str, port: int, world_size: int) -> dist.TCPStore:
    return dist.TCPStore(host, port, world_size, is_master=False, timeout=default_pg_timeout)


def init_distributed(device: torch.device | None = None, store: dist.Store | None = None) -> tuple[int, int]:
    """Join (or create) the default process group; returns (rank, world_size).

    With `store` (open_group_store / join_group_store; Ray workers), RANK and WORLD_SIZE come from
    the environment; otherwise RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT when set (torchrun);
    without them it creates a one-process group.
    """
    if not dist.is_initialized():
        device = resolve_device(device)
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if store is not None:
            dist.init_process_group(
                backend=backend, store=store, rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"])
            )
        elif "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend=backend)
        else:
            # a one-process group meets no one: an in-memory store, no port another process could take
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    return dist.get_rank(), dist.get_world_size()


def init_one_process_group(device: torch.device) -> None:
    """The default group of this one process on `device`'s backend (an in-memory store, no port), unless
    there is one already: workers.backend=local, whose model workers all share it (workers/local.py)."""
    if not dist.is_initialized():
        dist.init_process_group(
            backend="nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0, world_size=1
        )


def process_group() -> tuple[int, str] | None:
    """(world size, backend) of this process's default group; None when it has none."""
    return (dist.get_world_size(), str(dist.get_backend())) if dist.is_initialized() else None


def close_one_process_group() -> None:
    """Destroy this process's default group (init_one_process_group), if any."""
    if dist.is_initialized():
        dist.destroy_process_group()


BROADCAST_BUCKET_BYTES = 64 * 2**20


def broadcast_from_rank0(tensors: list[torch.Tensor]) -> None:
    """Overwrite every rank's `tensors` in place with rank 0's: one broadcast per bucket of tensors of one
    dtype and device (up to BROADCAST_BUCKET_BYTES, flattened into one buffer) instead of one per tensor.
    Each collective is a meeting of all ranks, and on a loaded CPU a meeting costs more than its bytes:
    the exactness matrix's two-rank cases spent ~13 ms of each ~0.15 s case in 29 one-tensor broadcasts.
    The values are copied, never computed: bit for bit rank 0's, as with one broadcast per tensor."""
    buckets: dict[tuple, list[list[torch.Tensor]]] = {}
    sizes: dict[tuple, int] = {}
    for tensor in tensors:
        key = (tensor.dtype, tensor.device)
        nbytes = tensor.numel() * tensor.element_size()
        if key not in buckets or sizes[key] + nbytes > BROADCAST_BUCKET_BYTES:
            buckets.setdefault(key, []).append([])
            sizes[key] = 0
        buckets[key][-1].append(tensor)
        sizes[key] += nbytes
    receive = dist.get_rank() != 0
    for bucket in (bucket for per_key in buckets.values() for bucket in per_key):
        if len(bucket) == 1 and bucket[0].is_contiguous():
            dist.broadcast(bucket[0], src=0)
            continue
        flat = torch.cat([tensor.reshape(-1) for tensor in bucket])
        dist.broadcast(flat, src=0)
        if receive:
            for tensor, piece in zip(bucket, flat.split([tensor.numel() for tensor in bucket])):
                tensor.copy_(piece.view_as(tensor))


def close_distributed() -> None:
    """Leave the process group cleanly: wait for every rank, then destroy it.

    A rank that exits while another still talks to it over gloo can abort the other
    ("terminate called without an active exception"), so spawned ranks call this before returning.
    """
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
