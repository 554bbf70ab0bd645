"""Deprecated: the loss checks moved to roll_lite.loss.checks."""

import warnings

from roll_lite.loss.checks import (  # noqa: F401 (re-exported: every name this module had)
    EXTRA_PADDING_COLUMNS,
    OUTPUT_NAMES,
    RecordingDict,
    Step,
    is_mask,
    mask_discipline_failure,
    padding_width_failure,
    relative_deviation,
    undeclared_mask_failure,
    undeclared_mask_reads,
    with_extra_padding,
    worst_grad_deviation,
)

warnings.warn(
    "roll_lite.loss_checks is deprecated: import from roll_lite.loss.checks instead",
    DeprecationWarning,
    stacklevel=2,
)
