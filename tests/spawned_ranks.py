"""Tests' own process groups: N spawned ranks that meet on a store the parent holds, and leave without a teardown abort.

The parent opens the group's rendezvous store on a port the OS picks and keeps it until the ranks are done.
Choosing a free port for rank 0 to listen on later leaves a window in which a test running beside this one
(the suite runs two pytest processes) can take it; a rank then meets a stranger's socket and the whole
spawn fails (one CI run on 2026-11-26: "process 1 terminated with signal SIGABRT" for the exactness matrix).
"""

from __future__ import annotations

import multiprocessing
import os
import sys

import torch
import torch.multiprocessing as mp

from roll_lite.strategy.distributed import close_distributed, init_distributed, join_group_store, open_group_store

HOST = "127.0.0.1"


def spawn_ranks(rank_main, world_size: int, *args, start_method: str = "forkserver") -> None:
    """Run rank_main(rank, world_size, port, *args) in world_size processes; each calls join_group first.

    start_method="forkserver" (the default): the ranks fork from one server process that has imported torch,
    transformers and the first caller's module once per pytest process, instead of ~5 CPU s of imports in
    every spawned rank (test_exactness_sp.py's 6 ranks, 2026-11-28, test_cpu plugin: 52 -> 29 CPU s). The
    server is started fresh, not forked from pytest, so the ranks inherit none of the test process's state."""
    store = open_group_store(HOST, world_size)
    if start_method == "forkserver":  # no effect once this process's server runs: the first call's list stays
        multiprocessing.set_forkserver_preload(
            ["torch", "transformers", "roll_lite.strategy.fsdp2", rank_main.__module__]
        )
    try:
        mp.start_processes(
            rank_main, args=(world_size, store.port, *args), nprocs=world_size, join=True, start_method=start_method
        )
    finally:
        del store


def join_group(rank: int, world_size: int, port: int, threads: int = 1) -> None:
    """Join the spawned ranks' process group before anything builds a strategy (which then reuses it)."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size))
    for key in ("MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(key, None)
    torch.set_num_threads(threads)
    init_distributed(store=join_group_store(HOST, port, world_size))


def leave_group() -> None:
    """A rank's end: wait for every rank, leave the group, then exit at once. Gloo (and DCP's collectives)
    leave helper threads behind; a rank whose interpreter then tore down normally was now and then aborted
    ("terminate called without an active exception", 1 CI run in 3 on 2026-11-25, after the barrier).
    Results are written by then, so skipping the teardown loses nothing."""
    close_distributed()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
