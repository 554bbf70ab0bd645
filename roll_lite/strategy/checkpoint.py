"""Sharded checkpoints of a strategy's model and optimizer through torch.distributed.checkpoint (DCP).

Every rank writes its own shards into one folder (on a filesystem every rank sees), rank 0 the
metadata. A folder written by D ranks loads on any number of ranks: DCP reads into each rank's
shards the slices it needs (resharding). The LR schedule and the count of skipped steps in a row are
the same on every rank: rank 0 writes them beside the shards.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from roll_lite.runtime.threads import one_torch_thread

SCHEDULE_FILE = "schedule.pt"


def _options(strategy, loading: bool = False) -> StateDictOptions:
    # Frozen parameters (LoRA's base) do not train: the run rebuilds them from the model's source, and
    # a checkpoint holds what trains, unless the base changed since (strategy.frozen_in_checkpoint: a
    # warm start merged into it). Loading is then not strict about the frozen ones; dcp.load has
    # already failed if the checkpoint lacked any of the others.
    skip = strategy.has_frozen_parameters and not strategy.frozen_in_checkpoint
    return StateDictOptions(ignore_frozen_params=skip, strict=not (loading and skip))


def _holds_frozen_parameters(strategy, folder: Path) -> bool:
    saved = dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    return any(f"model.{name}" in saved for name, p in strategy.model.named_parameters() if not p.requires_grad)


def _sharded_state(strategy) -> dict:
    """The model's (and optimizer's) state as DCP sees it: sharded DTensors, keyed by parameter name."""
    if strategy.optimizer is None:
        return {"model": get_model_state_dict(strategy.model, options=_options(strategy))}
    model, optimizer = get_state_dict(strategy.model, strategy.optimizer, options=_options(strategy))
    return {"model": model, "optimizer": optimizer}


# Saves and loads run at one torch thread: DCP's collectives run torch ops on gloo's helper threads; at
# more than one torch thread each of those starts an OpenMP team of its own that lives as long as the
# process group. Once OpenMP runs more threads than the machine has cores, libgomp stops spinning
# between parallel regions in every team, the training one included: on a 2-core box, 2 torch
# threads, every step after the first checkpoint was ~55 % slower.


def _for_dcp(strategy, state: dict) -> dict:
    """What DCP reads and writes: under expert parallelism each rank's experts as their piece of the whole tensors
    (roll_lite/strategy/expert_parallel.py checkpoint_view, sharing storage), else `state` itself."""
    if getattr(strategy, "expert_parallel", None) is None:
        return state
    from roll_lite.strategy.expert_parallel import checkpoint_view

    return checkpoint_view(state, strategy.model, strategy.expert_parallel)


def save_sharded(strategy, folder: Path) -> None:
    """A collective: every rank calls it with the same folder."""
    folder.mkdir(parents=True, exist_ok=True)
    with one_torch_thread():
        dcp.save(_for_dcp(strategy, _sharded_state(strategy)), checkpoint_id=str(folder))
    if strategy.rank == 0 and strategy.optimizer is not None:
        torch.save(
            {"scheduler": strategy.scheduler.state_dict(), "skipped_in_a_row": strategy.skipped_in_a_row},
            folder / SCHEDULE_FILE,
        )
    dist.barrier()


def load_sharded(strategy, folder: Path) -> None:
    """A collective; the folder may have been written by another number of ranks."""
    strategy.frozen_in_checkpoint = _holds_frozen_parameters(strategy, folder)
    state = _sharded_state(strategy)  # the targets: this run's shapes and sharding
    with one_torch_thread():
        dcp.load(_for_dcp(strategy, state), checkpoint_id=str(folder))
    if strategy.optimizer is None:
        set_model_state_dict(strategy.model, state["model"], options=_options(strategy, loading=True))
        return
    set_state_dict(
        strategy.model,
        strategy.optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"],
        options=_options(strategy, loading=True),
    )
    schedule = torch.load(folder / SCHEDULE_FILE, weights_only=True)
    strategy.scheduler.load_state_dict(schedule["scheduler"])
    strategy.skipped_in_a_row = schedule["skipped_in_a_row"]
