"""roll-train --config FILE [key=value ...]: validate the config, then run its pipeline.

Config problems print one line naming the key and exit with code 2 before anything starts: the
config's own values (config.py), then what needs the model's config, the tokenizer or this machine
(preflight.py).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Sequence

from roll_lite.config import ConfigError, load_config
from roll_lite.data import DataError
from roll_lite.importing import load_object
from roll_lite.preflight import check_run, check_sequence_lengths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="roll-train", description="Train a causal LM with RL (PPO, GRPO, ...).")
    parser.add_argument("--config", help="YAML file (e.g. configs/ppo.yaml); defaults apply to what it leaves out")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. steps=50 rollout.temperature=0.8")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config, args.overrides)
        pipeline_class = load_object(config.pipeline, search_cwd=True)  # like `python -m`, after the installed packages
        model_config = check_run(config)  # the model's config, the tokenizer, this machine: before Ray or any output
    except ConfigError as error:
        print(f"roll-train: config error: {error}", file=sys.stderr)
        return 2
    except (ImportError, AttributeError, ValueError) as error:
        print(f"roll-train: config error: pipeline: {error}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("roll_lite").setLevel(logging.INFO)
    pipeline = pipeline_class(config)
    try:
        pipeline.prepare_data()  # the data files, checked before Ray starts or the run directory exists
        check_sequence_lengths(config, model_config, *pipeline.longest_sequences())
        pipeline.run()
    except DataError as error:
        print(f"roll-train: data error: {error}", file=sys.stderr)
        return 2
    except ConfigError as error:  # found once connected to a cluster (e.g. too few CPUs); nothing written
        print(f"roll-train: config error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
