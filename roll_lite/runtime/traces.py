"""Per-sample traces: each training step's samples in <run dir>/traces/step_NNNNNN.parquet (docs/traces.md).

A pipeline's step leaves its rows (one dict per sample, keys from COLUMNS) in `pipeline.step_trace`;
RunSession.end_step hands them to TraceWriter.write before it logs the step's metrics and saves its
checkpoint. Each file is written whole under a hidden temporary name and renamed into place, so a
killed run never leaves a partial file that looks like a step's (readers skip names starting with '.').
A run that starts, fresh or resumed from the checkpoint of step k, first removes the files of the steps
after k and any temporary one: the directory then holds each step it trained exactly once.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

if TYPE_CHECKING:
    from roll_lite.runtime.tracking import RunLogger

logger = logging.getLogger("roll_lite")

TRACE_FILE = re.compile(r"step_(\d+)\.parquet")

_TOKENS = pa.list_(pa.int32())
_FLOATS = pa.list_(pa.float32())
REWARD_SOURCE = pa.struct(
    [("source", pa.string()), ("score", pa.float64()), ("outcome", pa.string()), ("reason", pa.string())]
)
TURN = pa.struct(
    [
        ("text", pa.string()),  # the model's turn as the environment read it (its tool calls, if any)
        ("ids", _TOKENS),
        ("reply", pa.string()),  # the environment's answer after it (null after the last turn)
        ("reply_ids", _TOKENS),
        ("reward", pa.float64()),  # the environment's reward for the turn
        ("weight_version", pa.int32()),
        ("env_seconds", pa.float64()),  # the environment's time on the turn's step
        ("metrics", pa.string()),  # the step's info["metrics"] as JSON (e.g. tool_calls)
    ]
)

# Every column a trace may have, in file order; a pipeline writes the ones that apply to it.
COLUMNS: dict[str, pa.DataType] = {
    "step": pa.int32(),
    "sample": pa.int32(),  # the row's index in the step's batch
    # RL (PPO, GRPO, distillation, multi-turn)
    "group": pa.int32(),  # the prompt's group (its rollout.num_samples samples share it)
    "prompt": pa.string(),  # chat messages as JSON
    "prompt_ids": _TOKENS,
    "response": pa.string(),
    "response_ids": _TOKENS,
    "answer": pa.string(),
    "reward": pa.float64(),  # the score the step trained on (shaped, the sources' weighted sum)
    "scored": pa.bool_(),  # every reward source scored the row
    "reward_sources": pa.list_(REWARD_SOURCE),
    "advantage": pa.float64(),  # the mean of token_advantages over the trained tokens
    # per response token (multi-turn: every token after the prompt, the environment's too)
    "loss_mask": pa.list_(pa.int8()),  # 1: the loss trains on the token
    "token_advantages": _FLOATS,
    "weight_versions": _TOKENS,  # the weight version that sampled the token; -1: the environment's
    "engine_log_probs": _FLOATS,
    "trainer_log_probs": _FLOATS,  # the actor's old log-probs, when the step computes them
    "log_prob_gap": _FLOATS,  # engine_log_probs - trainer_log_probs
    "reference_log_probs": _FLOATS,
    "teacher_log_probs": _FLOATS,  # on-policy distillation
    # multi-turn
    "turns": pa.list_(TURN),
    "end": pa.string(),  # terminated, truncated, max_turns, token_budget or fault
    "fault": pa.string(),
    # SFT: the whole sequence, loss_mask over it
    "text": pa.string(),
    "ids": _TOKENS,
    # preference pairs (DPO, reward model); prompt as above
    "chosen": pa.string(),
    "rejected": pa.string(),
    "chosen_ids": _TOKENS,
    "rejected_ids": _TOKENS,
    "margin": pa.float64(),
}


def trace_path(folder: Path, step: int) -> Path:
    return folder / f"step_{step:06d}.parquet"


def trace_table(rows: list[dict[str, Any]]) -> pa.Table:
    """The rows as a table of the COLUMNS they have, in COLUMNS' order and types."""
    keys = {key for row in rows for key in row}
    unknown = sorted(keys - COLUMNS.keys())
    if unknown:
        raise ValueError(f"trace: unknown column(s) {', '.join(unknown)} (roll_lite/runtime/traces.py COLUMNS)")
    schema = pa.schema([(name, kind) for name, kind in COLUMNS.items() if name in keys])
    return pa.Table.from_pylist(rows, schema=schema)


class TraceWriter:
    def __init__(self, folder: Path, enabled: bool, after_step: int, tracker: RunLogger | None = None):
        """`after_step`: the step the run starts after (its checkpoint's, 0 when fresh): the files of later
        steps are removed. `tracker`: its wandb run, if any, gets each step's table too."""
        self.folder, self.enabled, self.tracker = Path(folder), enabled, tracker
        removed = remove_after(self.folder, after_step)
        if removed:
            logger.info("traces: removed those of steps %s, after step %d", ", ".join(map(str, removed)), after_step)

    def write(self, step: int, rows: list[dict[str, Any]] | None) -> Path | None:
        if not self.enabled or not rows:
            return None
        table = trace_table([{"step": step, **row} for row in rows])
        self.folder.mkdir(parents=True, exist_ok=True)
        path = trace_path(self.folder, step)
        temporary = path.with_name(f".{path.name}.tmp")
        pq.write_table(table, temporary)
        os.replace(temporary, path)
        if self.tracker is not None and self.tracker.wandb_run is not None:  # the columns cost ~1 ms: only for wandb
            self.tracker.log_table(step, "traces", wandb_columns(table))
        return path


def remove_after(folder: Path, step: int) -> list[int]:
    """Remove the trace files of the steps after `step` and any temporary file; returns those steps."""
    if not folder.is_dir():
        return []
    removed = []
    for path in sorted(folder.iterdir()):
        match = TRACE_FILE.fullmatch(path.name)
        if match and int(match[1]) > step:
            path.unlink()
            removed.append(int(match[1]))
        elif path.name.startswith(".") and path.name.endswith(".tmp"):
            path.unlink()
    return removed


def wandb_columns(table: pa.Table) -> dict[str, list]:
    """A wandb table's columns: the scalars and texts as they are, the lists and structs as JSON."""
    columns = {}
    for name, column in zip(table.column_names, table.columns):
        values = column.to_pylist()
        nested = pa.types.is_list(column.type) or pa.types.is_struct(column.type)
        columns[name] = [json.dumps(v) for v in values] if nested else values
    return columns
