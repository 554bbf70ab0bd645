"""Data: the batch protocol (DataProto) and the prompt datasets a run trains and evaluates on.

Kept light on purpose: importing roll_lite.data must not import `datasets` (tests/test_imports.py),
nor torch: DataProto and undo_permutation (roll_lite.data.proto, on torch) load on first use, so that
a module of this package that needs neither, such as a judge's parser in its guarded child
(digit_domains.parse_verdict), starts in a fraction of a second.
The dataset modules are imported where they are used: files (read one file with `datasets`),
prompts (validate, tokenize), sft (SFT rows and their target masks), sequences (token-id lists into
batch tensors), masks (loss masks are 0/1),
lengths (the length filter both share), sampler
(seeded per-epoch order with a saved state), chat (chat templates), digits (the demo's data).
"""

from typing import TYPE_CHECKING, Any

from roll_lite.data.files import DataError

if TYPE_CHECKING:
    from roll_lite.data.proto import DataProto, undo_permutation

__all__ = ["DataError", "DataProto", "undo_permutation"]

_ON_TORCH = ("DataProto", "undo_permutation")


def __getattr__(name: str) -> Any:  # PEP 562: `from roll_lite.data import DataProto` imports torch here
    if name in _ON_TORCH:
        from roll_lite.data import proto

        for each in _ON_TORCH:
            globals()[each] = getattr(proto, each)
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
