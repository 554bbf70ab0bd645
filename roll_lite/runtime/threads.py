"""torch's intra-op threads, lowered for a while."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """torch at one intra-op thread inside, the caller's count again after (callers say why)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
