"""Deprecated: the loss-invariance checker moved to roll_lite.loss.checker (the command is
`roll-check-loss`, or `python -m roll_lite.loss.checker`)."""

import sys
import warnings

from roll_lite.loss.checker import (  # noqa: F401 (re-exported: every name this module had)
    DEFAULT_PARTITIONS,
    REFERENCE,
    TINY_MODEL,
    InvarianceReport,
    LossInvarianceError,
    Partition,
    RecordingDict,
    check_loss_invariance,
    diagnose,
    main,
    mask_discipline_failure,
    padding_width_failure,
    random_rl_batch,
    read_keys,
    relative_deviation,
    simulate_step,
    undeclared_mask_failure,
    undeclared_mask_reads,
    worst_grad_deviation,
)

warnings.warn(
    "roll_lite.invariance is deprecated: import from roll_lite.loss.checker instead "
    "(run the checker as roll-check-loss or python -m roll_lite.loss.checker)",
    DeprecationWarning,
    stacklevel=1 if __name__ == "__main__" else 2,  # run by `python -m`: the warning is this module's own
)

if __name__ == "__main__":
    sys.exit(main())
