"""The per-sample traces (roll_lite/runtime/traces.py, pipelines/traces.py): schema, bounding, atomic
writes, a resume's removal of the later steps, and an RL step's rows built from a batch. In-process; the
end-to-end runs' traces are checked in test_resume.py, test_multi_turn_run.py, test_preference_pipelines.py."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from roll_lite.pipelines.traces import mark_for_trace, objects, rl_trace

from roll_lite.config import ConfigError, load_config
from roll_lite.config.trace import traced_count
from roll_lite.data.sequences import build_sequence_batch
from roll_lite.runtime import traces
from roll_lite.runtime.traces import TraceWriter, trace_path, trace_table


def rows(n: int) -> list[dict]:
    return [{"sample": i, "response": f"r{i}", "response_ids": [i, i + 1], "reward": float(i)} for i in range(n)]


def test_a_trace_has_the_columns_its_rows_have_in_their_declared_types():
    table = trace_table([{"step": 3, **row} for row in rows(2)])
    assert table.column_names == ["step", "sample", "response", "response_ids", "reward"]
    assert table.schema.field("response_ids").type == pa.list_(pa.int32())
    assert table.schema.field("step").type == pa.int32()
    with pytest.raises(ValueError, match="unknown column.*rewards"):
        trace_table([{"rewards": 1.0}])


@pytest.mark.parametrize(("setting", "expected"), [("all", 8), (3, 3), (20, 8), (0, 0)])
def test_samples_per_step_bounds_a_step_to_its_first_samples(setting, expected):
    config = load_config(None, [f"trace.samples_per_step={setting}"])
    assert traced_count(config.trace, 8) == expected


@pytest.mark.parametrize("bad", ["some", "-1", "true"])
def test_samples_per_step_is_all_or_a_whole_number(bad):
    with pytest.raises(ConfigError, match="trace.samples_per_step"):
        load_config(None, [f"trace.samples_per_step={bad}"])


def test_each_step_is_one_file_renamed_into_place_and_a_killed_write_leaves_none(tmp_path, monkeypatch):
    folder = tmp_path / "traces"
    writer = TraceWriter(folder, True, 0)
    writer.write(1, rows(3))
    assert [p.name for p in folder.iterdir()] == ["step_000001.parquet"]

    def killed(table, where):  # the process dies halfway through writing step 2
        open(where, "wb").write(b"PAR1 half")
        raise KeyboardInterrupt

    monkeypatch.setattr(traces.pq, "write_table", killed)
    with pytest.raises(KeyboardInterrupt):
        writer.write(2, rows(3))
    assert not trace_path(folder, 2).exists()
    assert len(pd.read_parquet(folder)) == 3  # the hidden temporary file is not read as a step
    monkeypatch.undo()
    TraceWriter(folder, True, 1)  # the next run removes it
    assert sorted(p.name for p in folder.iterdir()) == ["step_000001.parquet"]


def test_a_resume_removes_the_steps_after_its_checkpoint_and_rewrites_them(tmp_path):
    folder = tmp_path / "traces"
    writer = TraceWriter(folder, True, 0)
    for step in range(1, 6):
        writer.write(step, rows(2))
    resumed = TraceWriter(folder, True, 3)
    assert sorted(p.name for p in folder.iterdir()) == [f"step_00000{s}.parquet" for s in (1, 2, 3)]
    for step in (4, 5):
        resumed.write(step, rows(1))
    steps = pd.read_parquet(folder)["step"].tolist()
    assert steps == [1, 1, 2, 2, 3, 3, 4, 5]  # each step once, no gap
    TraceWriter(folder, True, 0)  # a fresh start in the same folder keeps nothing
    assert not list(folder.iterdir())


def test_no_traces_written_when_off_or_empty(tmp_path):
    TraceWriter(tmp_path / "off", False, 0).write(1, rows(2))
    TraceWriter(tmp_path / "empty", True, 0).write(1, [])
    assert not (tmp_path / "off").exists() and not (tmp_path / "empty").exists()


class Tokens:
    def decode(self, ids, skip_special_tokens=False):
        return " ".join(map(str, ids))


def test_an_rl_step_traces_each_rows_prompt_response_reward_sources_and_tokens(tmp_path):
    """Two rows (prompt 2 and 1 tokens, responses 3 and 2): per-token columns cover exactly the response,
    even after a mask was zeroed (DAPO's overlong filter), the sources' outcomes ride with each row."""
    batch = build_sequence_batch([[1, 2], [3]], [[4, 5, 6], [7, 8]], 0, [[-0.1, -0.2, -0.3], [-0.4, -0.5]])
    batch.non_tensor_batch.update(
        response_text=objects(["4 5 6", "7 8"]), answer=objects(["x", None]), extra=objects([{}, {}])
    )
    batch.batch["group_ids"] = torch.tensor([0, 0])
    outcomes = [[("exact", 1.0, "ok", None)], [("exact", 0.0, "timed_out", "no result within 5 s")]]
    mark_for_trace(batch, SimpleNamespace(outcomes=lambda: outcomes))
    batch.batch["response_mask"] = batch["response_mask"] * torch.tensor([[1], [0]])  # the second row filtered
    batch.batch["old_log_probs"] = batch["rollout_log_probs"] - 0.25 * batch["response_mask"]
    batch.batch["advantages"] = batch["response_mask"] * 2.0
    config = load_config(None, ["trace.samples_per_step=all"])
    pipeline = SimpleNamespace(config=config, tokenizer=Tokens(), loss_mask_key="response_mask")
    first, second = rl_trace(pipeline, 5, batch, torch.tensor([1.0, 0.0]), weights_behind=1)
    assert (first["prompt_ids"], first["response_ids"], second["prompt_ids"], second["response_ids"]) == (
        [1, 2],
        [4, 5, 6],
        [3],
        [7, 8],
    )
    assert first["loss_mask"] == [1, 1, 1] and second["loss_mask"] == [0, 0]
    assert first["advantage"] == 2.0 and second["advantage"] is None
    assert first["weight_versions"] == [3, 3, 3]  # step 5, one step behind: sampled by version 3
    assert first["engine_log_probs"] == pytest.approx([-0.1, -0.2, -0.3])
    assert first["log_prob_gap"] == pytest.approx([0.25] * 3) and second["log_prob_gap"] == pytest.approx([0, 0])
    assert second["reward_sources"] == [
        {"source": "exact", "score": 0.0, "outcome": "timed_out", "reason": "no result within 5 s"}
    ]
    assert (first["answer"], second["answer"]) == ("x", None)
    TraceWriter(tmp_path, True, 0).write(5, [first, second])
    read = pq.read_table(trace_path(tmp_path, 5)).to_pylist()
    assert read[1]["reward_sources"][0]["outcome"] == "timed_out" and read[0]["response"] == "4 5 6"
    config = load_config(None, ["trace.samples_per_step=1"])
    assert len(rl_trace(SimpleNamespace(**{**vars(pipeline), "config": config}), 5, batch, torch.zeros(2), 0)) == 1
