"""The seed of an environment whose data row carries none."""

from __future__ import annotations

import hashlib

SEED_RANGE = 2**31  # what every seeding API takes: random.seed, numpy's legacy RandomState, torch.manual_seed


def derived_seed(data_seed: int, split: str, row: int) -> int:
    """A seed in [0, 2**31) drawn by hash from data.seed, the split ('train' / 'eval') and the row index.

    A hash leaves no pattern for an environment to see. The affine formula used before,
    (data_seed · 1000003 + row) · 2 + is_eval, made every training seed even and every eval seed odd: an
    environment that picks its task by `seed % n` trained on half of its tasks and was evaluated on the other.
    """
    digest = hashlib.blake2b(f"{data_seed}/{split}/{row}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % SEED_RANGE
