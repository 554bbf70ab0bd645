"""Rows from a package instead of a file (data.source): the package's own task, by its own id and
arguments, generates the rows, and the package's own scorer grades them (the reward of the same name).

    data: {source: reasoning_gym, source_task: basic_arithmetic, source_args: {max_terms: 2},
           source_size: 1000, source_eval_size: 64}
    reward: {functions: {reasoning_gym: 1.0}}

A source's rows are a fixed table, seeded: a run repeats, and the training order (data.shuffle,
data.domain_weights) resumes exactly from a checkpoint as with a file. Each row names its domain
(its task id: a `composite` task's rows name the task each came from, so data.domain_weights and
reward.domains route them) and carries what the scorer needs to rebuild its entry (source_task, source_args,
source_seed, source_size, source_index): nothing of the package is copied into roll_lite.
Held-out rows come from another seed, minus any whose question is also a training question.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Callable

from roll_lite.data.files import DataError, Table

EVAL_SEED_OFFSET = 1_000_003  # the held-out rows' seed: the training seed plus this


def reasoning_gym_dataset(task: str, args_json: str, seed: int, size: int):
    """reasoning_gym's dataset `task` (its own registry and config class); cached, as the scorer
    rebuilds it for every row it grades."""
    return _reasoning_gym_dataset(task, args_json, seed, size)


@functools.lru_cache(maxsize=16)
def _reasoning_gym_dataset(task: str, args_json: str, seed: int, size: int):
    try:
        import reasoning_gym
    except ModuleNotFoundError as error:
        raise DataError(
            f"data.source: reasoning_gym needs the reasoning-gym package (bash scripts/setup.sh dev,envs) ({error})"
        ) from None
    args = json.loads(args_json)
    try:
        if task == "composite" and isinstance(args.get("datasets"), list):  # its YAML form, by its own class
            from reasoning_gym.composite import DatasetSpec

            args["datasets"] = [DatasetSpec(**spec) for spec in args["datasets"]]
        return reasoning_gym.create_dataset(task, seed=seed, size=size, **args)
    except ValueError as error:
        if "not registered" in str(error):
            known = ", ".join(sorted(reasoning_gym.factory.DATASETS))
            raise DataError(f"data.source_task: reasoning_gym has no task {task!r}; its tasks: {known}") from None
        raise DataError(f"data.source_args: reasoning_gym task {task!r} refused {args_json}: {error}") from None
    except (TypeError, AssertionError) as error:  # an unknown argument, or its config's own checks
        raise DataError(
            f"data.source_args: reasoning_gym task {task!r} refused {args_json}: {error or type(error).__name__}"
        ) from None


def reasoning_gym_rows(task: str, args: dict, seed: int, size: int) -> list[dict]:
    args_json = json.dumps(args, sort_keys=True)
    dataset = reasoning_gym_dataset(task, args_json, seed, size)
    return [
        {
            "prompt": entry["question"],
            "answer": "" if entry["answer"] is None else str(entry["answer"]),
            "domain": entry["metadata"].get("source_dataset", task),  # a composite's rows: their own task
            "source_task": task,
            "source_args": args_json,
            "source_seed": seed,
            "source_size": size,
            "source_index": index,
        }
        for index, entry in enumerate(dataset)
    ]


SOURCES: dict[str, Callable[[str, dict, int, int], list[dict]]] = {"reasoning_gym": reasoning_gym_rows}


def source_tables(data: Any, seed: int) -> tuple[Table, Table | None]:
    """(the training table, the held-out table or None) of data.source; DataError naming the key on a
    bad task or arguments. Held-out rows whose question is a training question are left out."""
    generate = SOURCES[data.source]
    names = {"prompt": data.prompt_key, "answer": data.answer_key, "domain": data.domain_key}

    def make_rows(task: str, args: dict, seed: int, size: int) -> list[dict]:  # under the data.*_key names
        return [{names.get(key, key): value for key, value in row.items()} for row in generate(task, args, seed, size)]

    name = f"{data.source}:{data.source_task}"
    train_rows = make_rows(data.source_task, dict(data.source_args), seed, data.source_size)
    columns = list(train_rows[0]) if train_rows else []
    train = Table(f"{name} (seed {seed})", "data.source_size", train_rows, columns)
    if not data.source_eval_size:
        return train, None
    eval_seed = seed + EVAL_SEED_OFFSET
    seen = {row[data.prompt_key] for row in train_rows}
    eval_rows = [
        row
        for row in make_rows(data.source_task, dict(data.source_args), eval_seed, data.source_eval_size)
        if row[data.prompt_key] not in seen
    ]
    if not eval_rows:
        raise DataError(
            f"data.source_eval_size: every held-out row of {name} is also a training row (the task has too "
            "few distinct questions: widen data.source_args or lower data.source_size)"
        )
    return train, Table(f"{name} (seed {eval_seed}, held out)", "data.source_eval_size", eval_rows, columns)
