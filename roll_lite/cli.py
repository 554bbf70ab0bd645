"""roll-train --config FILE [key=value ...]: validate the config, then run its pipeline.

Config problems print one line naming the key and exit with code 2 before anything starts: the
config's own values (config.py), then what needs the model's config, the tokenizer or this machine
(preflight.py), then what the pipeline refuses once built (its constructor, the checkpoint `resume`
reads, its data's checks): no run directory or Ray until then. A worker that raises, dies or runs
out of memory: its role, rank and step, then its traceback, exit code 1. SIGINT / SIGTERM: the step
is abandoned, the workers stop, exit code 130 / 143. A run that `resume` would continue but has
reached its steps: one line saying so, exit code 0, nothing started or changed.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
import sys
import time
from typing import Sequence

from roll_lite.config import ConfigError, load_config
from roll_lite.data import DataError
from roll_lite.errors import StaleRolloutWeights
from roll_lite.pipelines.preflight import check_run, check_sequence_lengths
from roll_lite.runtime.failures import WorkerError
from roll_lite.runtime.importing import load_object
from roll_lite.runtime.progress import (
    close_bars,
    plain_text_off_terminal,
    process_start,
    start_clock,
    use_terminal_logging,
)
from roll_lite.runtime.reproducibility import pin_kernels
from roll_lite.runtime.signals import received_signal


def config_file_as_override(config: str | None, overrides: Sequence[str]) -> str | None:
    """The error for a config file given where the key=value overrides go (`roll-train configs/ppo.yaml`),
    or None. With no --config it shows the command that gives the file with --config."""
    for word in overrides:
        if "=" in word or not (word.endswith((".yaml", ".yml")) or os.path.isfile(word)):
            continue
        if config is not None:
            return (
                f"'{word}' is not a key=value override, and --config already names '{config}': one config file per run"
            )
        rest = [other for other in overrides if other != word]
        return (
            f"'{word}' is not a key=value override: give a config file with --config, "
            f"e.g. roll-train {shlex.join(['--config', word, *rest])}"
        )
    return None


def import_pipeline(spec: str) -> type:
    """config.pipeline's class, imported like `python -m` does (after the installed packages, the
    current directory); what keeps it from importing is a ConfigError naming the key."""
    try:
        return load_object(spec, search_cwd=True)
    except (ImportError, AttributeError, ValueError) as error:
        raise ConfigError(f"pipeline: {error}") from None


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:  # the command itself (roll-train, python -m roll_lite.cli), not a call from Python
        start_clock(process_start())
        plain_text_off_terminal()
    else:
        start_clock(time.monotonic())
    parser = argparse.ArgumentParser(prog="roll-train", description="Train a causal LM with RL (PPO, GRPO, ...).")
    parser.add_argument("--config", help="YAML file (e.g. configs/ppo.yaml); defaults apply to what it leaves out")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. steps=50 rollout.temperature=0.8")
    args = parser.parse_args(argv)
    try:
        if (misplaced := config_file_as_override(args.config, args.overrides)) is not None:
            raise ConfigError(misplaced)
        notes: list[str] = []
        config = load_config(args.config, args.overrides, notes)
        pin_kernels(config.reproducible)  # before anything below runs a torch op: the kernels are chosen then
        pipeline_class = import_pipeline(config.pipeline)
        model_config = check_run(config)  # the model's config, the tokenizer, this machine: before Ray or any output
    except ValueError as error:  # ConfigError, or a check's ValueError: one line that names its key
        print(f"roll-train: config error: {error}", file=sys.stderr)
        return 2
    use_terminal_logging(logging.INFO, "%(asctime)s %(message)s", "%H:%M:%S")
    logging.getLogger("roll_lite").setLevel(logging.INFO)
    from roll_lite.pipelines.loss_check import LossCheckFailed, check_own_losses  # after the user's pipeline: same tree
    from roll_lite.pipelines.session import finished_run

    pipeline = None
    try:
        # Up to pipeline.run()'s claim of the run directory nothing is written: a ConfigError until then
        # (the pipeline's constructor refusing a key, an unreadable checkpoint `resume` would continue,
        # a teacher's tokenizer) is one line and exit code 2, like those above.
        pipeline = pipeline_class(config)
        pipeline.startup_notes = notes  # workers.backend=auto's choice: logged as the run starts (pipelines/session.py)
        if (finished := finished_run(pipeline)) is not None:  # resume=auto of a run that reached its steps
            print(f"roll-train: {finished}", file=sys.stderr)
            return 0
        if (checked := check_own_losses(pipeline)) is not None:
            logging.getLogger("roll_lite").info(checked)
        pipeline.prepare_data()  # the data files, checked before Ray starts or the run directory exists
        check_sequence_lengths(config, model_config, *pipeline.longest_sequences())
        pipeline.run()
    except LossCheckFailed as failure:
        print(f"roll-train: loss check: {failure}", file=sys.stderr)
        return 2
    except DataError as error:
        print(f"roll-train: data error: {error}", file=sys.stderr)
        return 2
    except ConfigError as error:  # also once connected to a cluster (e.g. too few CPUs); nothing written
        print(f"roll-train: config error: {error}", file=sys.stderr)
        return 2
    except StaleRolloutWeights as error:
        close_bars()
        print(f"roll-train: rollout error: {error}", file=sys.stderr)
        return 1
    except WorkerError as error:
        close_bars()
        print(f"roll-train: {'' if error.kind == 'stopped' else 'worker failure: '}{error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # SIGINT or SIGTERM (roll_lite/runtime/signals.py), or Ctrl-C before Ray started
        signum = received_signal() or signal.SIGINT
        close_bars()
        print(
            f"roll-train: stopped by {signal.Signals(signum).name} during "
            f"{'start-up' if pipeline is None else pipeline.stage}, which was abandoned; "
            "the workers and Ray were stopped",
            file=sys.stderr,
        )
        return 128 + signum
    return 0


if __name__ == "__main__":
    sys.exit(main())
