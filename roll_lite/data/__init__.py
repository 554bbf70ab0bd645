"""Data: the batch protocol (DataProto) and the prompt datasets a run trains and evaluates on.

Kept light on purpose: importing roll_lite.data must not import `datasets` (tests/test_imports.py).
The dataset modules are imported where they are used: files (read one file with `datasets`),
prompts (validate, tokenize), sft (SFT rows and their target masks), sequences (token-id lists into
batch tensors), masks (loss masks are 0/1),
lengths (the length filter both share), sampler
(seeded per-epoch order with a saved state), chat (chat templates), digits (the demo's data).
"""

from roll_lite.data.files import DataError
from roll_lite.data.proto import DataProto, undo_permutation

__all__ = ["DataError", "DataProto", "undo_permutation"]
