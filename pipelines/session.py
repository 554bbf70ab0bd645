"""RunSession: what every pipeline's run() does around its own loop, in one place.

    with RunSession(pipeline, reservation(config)) as session:
        pipeline.start_workers()
        resumed_step = session.begin()          # from the checkpoint `resume` picked, or 0: a fresh run
        ... session.end_step(step, metrics, last=...) after each step (log, then a due checkpoint)

Entering claims the run directory (roll_lite/checkpoint/run_dir.py: the lock; fresh, resumed or
refused before anything in it changes; a resume that changes keys it may not is refused, its other
changes are logged and recorded: roll_lite/checkpoint/compat.py) and starts Ray (or, under
workers.backend=local, nothing: workers/local.py). Leaving, whatever happened: a WorkerError is given
the pipeline's stage and logged; on SIGINT / SIGTERM a checkpoint that was due is written; the tracker
is finished (plots, wandb), Ray stopped (or the local workers closed) and the lock released.

A pipeline provides: `config`, `stage` (a phrase: where run() is), `sampler` (its position is saved),
`total_steps` (and `total_steps_key`, the config key that sets it), `data_used_up` (its data.epochs / sft.epochs ended), and for its checkpoints
`checkpoint_groups()`, `save_driver_state(folder)`,
`load_driver_state(folder, step)` and `checkpoint_compat_keys` (roll_lite/checkpoint/pipeline_state.py).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch

from roll_lite.checkpoint.config_changes import config_yaml as recorded_config
from roll_lite.runtime.failures import WorkerError

if TYPE_CHECKING:
    from roll_lite.workers.placement import Reservation

    from roll_lite.checkpoint import Checkpointer, RunDirClaim
    from roll_lite.checkpoint.config_changes import ConfigChange
    from roll_lite.runtime.traces import TraceWriter
    from roll_lite.runtime.tracking import RunLogger

logger = logging.getLogger("roll_lite")

DRIVER_TORCH_THREADS = 1
LAST_WORKER_LINES_S = 0.5  # before Ray stops: time for its log monitor to forward the workers' last lines


def finished_run(pipeline) -> str | None:
    """The line to print instead of running, when `resume` would continue a run that already reached
    the pipeline's total steps (and wrote final/ when save_model): nothing is started or changed. It
    names the keys this run sets otherwise than the run's config.yaml: none of them was applied."""
    from roll_lite.checkpoint.config_changes import changed_keys, saved_config
    from roll_lite.checkpoint.pipeline_state import read_manifest
    from roll_lite.checkpoint.run_dir import finished_checkpoint

    c = pipeline.config
    run_dir = Path(c.output_dir) / c.run_name
    checkpoint = finished_checkpoint(run_dir, c.resume, pipeline.total_steps, c.save_model)
    if checkpoint is None:
        return None
    step, key = read_manifest(checkpoint).get("step", 0), pipeline.total_steps_key
    changes = changed_keys(saved_config(checkpoint), c)
    not_applied = (
        f"; these keys differ from the run's config.yaml and were not applied: {', '.join(map(str, changes))}"
        if changes
        else ""
    )
    return (
        f"{run_dir} is finished at step {step} ({key}={pipeline.total_steps}); nothing was started or changed"
        f"{not_applied}. To train it further, raise {key}= above {step}"
    )


class RunSession:
    # None until __enter__ claims the run directory and begin() opens the tracker and the checkpointer
    claim: RunDirClaim | None
    tracker: RunLogger | None
    checkpointer: Checkpointer | None

    def __init__(self, pipeline, reserved: Reservation | None):
        """`reserved`: what the workers ask Ray for (None under workers.backend=local, workers/group.py)."""
        self.pipeline, self.config, self.reserved = pipeline, pipeline.config, reserved
        self.run_dir = Path(self.config.output_dir) / self.config.run_name
        self.claim = self.tracker = self.checkpointer = None
        self.traces: TraceWriter | None = None  # begin() opens it
        self.completed = 0  # the last step whose metrics were logged
        self.config_changes: list[ConfigChange] = []  # what this run changes against the checkpoint it resumes

    # -- entering and leaving -----------------------------------------------------------------------

    def __enter__(self) -> RunSession:
        from roll_lite.runtime.reproducibility import kernel_env, pin_kernels

        # After the data were read (a data error stays one line), before any worker starts: roll-train's
        # notes on what it chose for the run (workers.backend=auto's choice, roll_lite/config/backend.py).
        for note in getattr(self.pipeline, "startup_notes", ()):
            logger.info(note)
        # Before Ray starts: a local cluster's workers inherit this process's environment.
        logger.info(pin_kernels(self.config.reproducible))
        # One torch thread for the driver, whatever this machine's core count: its reductions
        # (advantages, whitening) then sum in the same order everywhere, and it has no OpenMP thread
        # of its own spinning between its small ops on the cores the workers compute on.
        torch.set_num_threads(DRIVER_TORCH_THREADS)
        self.claim = self.claim_run_dir()
        try:
            if self.config.workers.backend == "local":  # every worker in this process, no Ray (workers/local.py)
                from roll_lite.workers.local import start_local

                logger.info(start_local())
            else:
                from roll_lite.workers.cluster import start_ray

                assert self.reserved is not None  # workers/group.py reservation: None only under local
                # Ray first: a joined cluster too small for the workers is reported before anything is written.
                logger.info(
                    start_ray(
                        self.config.ray_address,
                        self.reserved,
                        self.config.workers.object_store_mb,
                        kernel_env(self.config.reproducible),
                    )
                )
        except BaseException:
            self.claim.release()
            raise
        return self

    def __exit__(self, kind, error, traceback) -> Literal[False]:
        stage = self.pipeline.stage
        try:
            if isinstance(error, WorkerError):
                error.stage = stage
                logger.error("%s; stopping the workers", error.headline())
            elif isinstance(error, KeyboardInterrupt):  # SIGINT / SIGTERM (roll_lite/runtime/signals.py)
                logger.warning("interrupted during %s; stopping the workers", stage)
                self.checkpoint_on_stop()
        finally:
            if self.tracker is not None:
                self.tracker.finish()
            self.stop_workers()
            assert self.claim is not None  # __enter__ claimed it before anything could fail
            self.claim.release()
        return False

    def stop_workers(self) -> None:
        if self.config.workers.backend == "local":
            from roll_lite.workers.local import stop_local

            stop_local()
            return
        from roll_lite.workers.cluster import stop_ray

        # Ray's log monitor forwards the workers' output from their log files, polling every 0.1 s:
        # their last lines (the final model's save, a failing worker's own message) reach this log
        # before Ray stops only with a moment for it (matplotlib's plotting once gave it a second)
        time.sleep(LAST_WORKER_LINES_S)
        stop_ray()

    def claim_run_dir(self) -> RunDirClaim:
        """Lock the run directory and pick the checkpoint to resume (config `resume`), checked against
        this run's config. Raises CheckpointError (one line) before anything changes."""
        from roll_lite.checkpoint import claim_run_dir
        from roll_lite.checkpoint.compat import check_compatible

        claim = claim_run_dir(self.run_dir, self.config.resume)
        if claim.resume_from is not None:
            try:
                self.config_changes = check_compatible(
                    claim.resume_from, self.config, self.pipeline.checkpoint_kind, self.pipeline.checkpoint_compat_keys
                )
            except BaseException:
                claim.release()
                raise
        return claim

    # -- the run --------------------------------------------------------------------------------------

    def begin(self) -> int:
        """After the workers started: log which node each role runs on (on a cluster of several nodes),
        put the workers back as the claimed checkpoint left them (if any), open the tracker
        (metrics.jsonl continued from the checkpoint's records) and the checkpointer. Returns the
        checkpoint's step, 0 for a fresh run."""
        from roll_lite.checkpoint import Checkpointer
        from roll_lite.runtime.traces import TraceWriter
        from roll_lite.runtime.tracking import RunLogger

        if self.config.workers.backend == "ray":  # local: every role in this process
            from roll_lite.workers.cluster import where_the_roles_run

            roles = {
                name: getattr(self.pipeline, name, None)
                for name in ("actor", "reference", "critic", "rollout", "reward")
            }
            if (placement := where_the_roles_run(roles)) is not None:
                logger.info(placement)
        c, resumed_step, history, config_history = self.config, 0, None, []
        assert self.claim is not None  # __enter__ claimed it
        if self.claim.resume_from is not None:
            self.pipeline.stage = f"resuming from {self.claim.resume_from}"
            resumed_step, history = self.resume(self.claim.resume_from)
            self.completed = resumed_step
            config_history = self.config_history(self.claim.resume_from, resumed_step)
        config_yaml = recorded_config(c, config_history)
        self.tracker = RunLogger(self.run_dir, config_yaml, c.wandb_mode, c.wandb_project, c.run_name, history)
        self.checkpointer = Checkpointer(
            self.run_dir, c.checkpoint, config_yaml, self.pipeline, self.tracker, config_history
        )
        # the steps after resumed_step a killed run traced are removed: each step is traced once
        self.traces = TraceWriter(self.run_dir / "traces", c.trace.samples_per_step != 0, resumed_step, self.tracker)
        return resumed_step

    def resume(self, checkpoint: Path) -> tuple[int, list[dict]]:
        """The workers, the sampler and the generators as they were at `checkpoint`. Returns (its step,
        the metrics records up to it)."""
        from roll_lite.checkpoint.pipeline_state import load_pipeline_state
        from roll_lite.checkpoint.run_dir import discard_after, read_history

        step = load_pipeline_state(self.pipeline, checkpoint)
        history = read_history(checkpoint)
        removed = discard_after(self.run_dir, step, trains_on=step < self.pipeline.total_steps)
        logger.info(
            "resumed from %s (step %d)%s",
            checkpoint,
            step,
            f"; removed what came after it: {', '.join(removed)}" if removed else "",
        )
        return step, history

    def config_history(self, checkpoint: Path, step: int) -> list[dict]:
        """The config changes of the resumes that led to `checkpoint`, and this one's (logged)."""
        from roll_lite.checkpoint.config_changes import history_entry
        from roll_lite.checkpoint.pipeline_state import read_manifest

        earlier = read_manifest(checkpoint).get("config_changes", [])
        if not self.config_changes:
            return earlier
        logger.info(
            "resume: changed since %s, applied from step %d on and recorded in config.yaml: %s",
            checkpoint.name,
            step + 1,
            ", ".join(map(str, self.config_changes)),
        )
        return [*earlier, history_entry(step, self.config_changes)]

    def log(self, step: int, metrics: dict[str, float], eval_samples: list[dict] | None = None) -> None:
        assert self.tracker is not None  # begin() opened it
        self.tracker.log(step, metrics, eval_samples)
        self.completed = step

    def end_step(
        self, step: int, metrics: dict[str, float], eval_samples: list[dict] | None = None, last: bool = False
    ) -> None:
        """After a training step: its metrics, then its checkpoint when one is due (`last`: no step follows)."""
        # the step's samples (pipeline.step_trace, roll_lite/runtime/traces.py) before its checkpoint
        assert self.traces is not None  # begin() opened it
        self.traces.write(step, getattr(self.pipeline, "step_trace", None))
        self.pipeline.step_trace = None
        self.log(step, metrics, eval_samples)
        assert self.checkpointer is not None  # begin() opened it
        before, self.pipeline.stage = self.pipeline.stage, f"the checkpoint of step {step}"  # a failure in it says so
        self.checkpointer.maybe_save(step, last)
        self.pipeline.stage = before

    def checkpoint_on_stop(self) -> None:
        """On SIGINT / SIGTERM: write the checkpoint of the last completed step if it was due and is not
        written yet. end_step() saves right after logging a step, so a due checkpoint still missing
        means the signal came before the next step began: the workers hold exactly that step's state.
        Once the next step has begun, the actor may hold part of it, and nothing is written."""
        step, checkpointer = self.completed, self.checkpointer
        if checkpointer is None or step == 0:
            logger.info("no checkpoint written on stop: no step was completed")
            return
        last = step == self.pipeline.total_steps or self.pipeline.data_used_up
        if checkpointer.due(step, last):
            checkpointer.save(step)
        elif checkpointer.last_saved == step:
            logger.info("the checkpoint of the last completed step, %d, is written", step)
        else:
            logger.info(
                "no checkpoint written on stop: the last completed step, %d, was not due (checkpoint.every=%d)",
                step,
                self.config.checkpoint.every,
            )
