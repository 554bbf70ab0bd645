"""One CPU measurement in a process of its own, forked from the caller after its imports.

The child starts with the caller's modules imported (torch, roll_lite: 2-5 CPU s that a fresh interpreter
pays again) and nothing of the measurement: no model, no tensors, no compile cache; its peak resident memory
(VmHWM) starts at what it holds when forked. Library pages the caller had mapped are mapped again in the child
as it first touches them, so a CPU peak can read a few MiB above a fresh process's (~10 MiB in mfu.py --smoke).
So the benchmarks fork for their --smoke runs only (tests/test_benchmark_scripts.py), on CPU: CUDA does not
work in a fork of a process that initialized it.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import traceback

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def run_forked(function, *args, timeout: float | None = None, mmap_threshold: int | None = None) -> dict:
    """function(*args), a dict, computed in a forked child; {"failed": why} if the child ended without one.
    `mmap_threshold`: glibc's, fixed in the child as MALLOC_MMAP_THRESHOLD_ would fix it in a new process
    (freed blocks of that size and more leave the resident set)."""
    context = multiprocessing.get_context("fork")  # its Popen flushes stdout and stderr before forking
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(send, function, args, mmap_threshold))
    child.start()
    send.close()
    try:
        result = receive.recv() if receive.poll(timeout) else {"failed": f"no result in {timeout} s"}
    except EOFError:  # it ended without sending
        result = None
    if child.is_alive():
        child.kill()
    child.join()
    return result if result is not None else {"failed": f"exit {child.exitcode}: no result"}


def _child(send, function, args, mmap_threshold: int | None) -> None:
    if mmap_threshold is not None:
        ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, mmap_threshold)
    try:
        result = function(*args)
    except Exception as error:  # as a failed process's last line of stderr would say
        traceback.print_exc()
        send.send({"failed": f"exit 1: {traceback.format_exception_only(error)[-1].strip()}"})
        raise SystemExit(1) from None
    send.send(result)
