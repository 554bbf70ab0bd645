"""Checkpoints (DCP model / optimizer shards, RNG, sampler, metrics), resume, run-directory ownership."""

from roll_lite.checkpoint.checkpointer import Checkpointer
from roll_lite.checkpoint.errors import CheckpointError
from roll_lite.checkpoint.run_dir import RunDirClaim, claim_run_dir

__all__ = ["Checkpointer", "CheckpointError", "RunDirClaim", "claim_run_dir"]
