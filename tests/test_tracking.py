"""RunLogger (roll_lite/runtime/tracking.py) on resume: metrics.jsonl is cut back to the checkpoint and
continued, and the run directory's wandb run (real wandb, offline) is continued under the same id,
without sending again the steps the stopped run had already logged."""

import json
import re

from roll_lite.runtime.traces import TraceWriter
from roll_lite.runtime.tracking import WANDB_ID_FILE, RunLogger, step_span


def test_a_resumed_run_continues_metrics_jsonl_and_its_wandb_run(tmp_path):
    run_dir = tmp_path / "run"
    first = RunLogger(run_dir, "seed: 1\n", "offline", "roll_lite_test", "run")
    for step in range(5):  # steps 0-4 logged; say the checkpoint was at step 2 when it was killed
        first.log(step, {"x": float(step)})
    first.wandb_run.finish()
    run_id = (run_dir / WANDB_ID_FILE).read_text().strip()
    assert first.wandb_run.id == run_id

    resumed = RunLogger(run_dir, "seed: 1\n", "offline", "roll_lite_test", "run", history=first.history[:3])
    sent = []
    real_log = resumed.wandb_run.log
    resumed.wandb_run.log = lambda metrics, step: (sent.append(step), real_log(metrics, step=step))
    for step in (4, 5):  # a step's traced samples (roll_lite/runtime/traces.py): as its metrics
        resumed.log_table(step, "traces", {"sample": [0], "response": ["a"]})
    for step in range(3, 7):
        resumed.log(step, {"x": 10.0 + step})
    resumed.finish()

    assert resumed.wandb_run.id == run_id and resumed.wandb_from_step == 5
    assert sent == [5, 5, 6]  # 3 and 4 are in the wandb run already (from the stopped run); 5's table, then metrics
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    launched = [record.pop("perf/since_launch_s") for record in records]  # every record: its wall time from launch
    assert records == [{"step": s, "x": float(s)} for s in range(3)] + [{"step": s, "x": 10.0 + s} for s in range(3, 7)]
    assert all(t > 0 for t in launched) and launched[3:] == sorted(launched[3:])  # this process's age: any size
    segments = sorted(p.name for p in (run_dir / "wandb").glob("offline-run-*"))
    # wandb names a segment offline-run-<time>-<id>, with "-1" added when both start in the same second
    assert len(segments) == 2 and all(
        re.fullmatch(rf"offline-run-\d{{8}}_\d{{6}}-{run_id}(-\d+)?", n) for n in segments
    )


def test_a_fresh_run_in_another_directory_gets_its_own_wandb_run(tmp_path):
    one = RunLogger(tmp_path / "one", "seed: 1\n", "offline", "roll_lite_test", "one")
    TraceWriter(tmp_path / "one" / "traces", True, 0, one).write(1, [{"sample": 0, "response_ids": [4, 5]}])
    one.finish()
    (table,) = (tmp_path / "one" / "wandb").glob("offline-run-*/files/media/table/traces_*.table.json")
    assert json.loads(table.read_text()) == {"columns": ["step", "sample", "response_ids"], "data": [[1, 0, "[4, 5]"]]}
    two = RunLogger(tmp_path / "two", "seed: 1\n", "offline", "roll_lite_test", "two")
    two.finish()
    assert one.wandb_run.id != two.wandb_run.id
    assert two.wandb_from_step == 0


def test_resuming_cuts_metrics_jsonl_back_to_the_checkpoint_and_says_which_steps_it_dropped(tmp_path, caplog):
    run_dir = tmp_path / "run"
    first = RunLogger(run_dir, "seed: 1\n", "disabled", "roll_lite_test", "run")
    for step in range(58):  # the checkpoint of step 50, then steps 51-57 logged before the kill
        first.log(step, {"x": float(step)})
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write('{"step": 58, "x"')  # a record cut short by the kill
    caplog.set_level("INFO", logger="roll_lite")
    resumed = RunLogger(run_dir, "seed: 1\n", "disabled", "roll_lite_test", "run", history=first.history[:51])
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == list(
        range(51)
    )
    assert resumed.history == first.history[:51]
    assert caplog.messages == [
        "resume: dropped the records of steps 51-57 that the previous run logged after checkpoint step_50"
    ]

    caplog.clear()  # killed right after the checkpoint of step 60: nothing logged after it, nothing said
    for step in range(51, 61):
        resumed.log(step, {"x": float(step)})
    RunLogger(run_dir, "seed: 1\n", "disabled", "roll_lite_test", "run", history=resumed.history)
    assert caplog.messages == []


def test_step_span_names_one_step_a_range_or_a_list():
    assert [step_span(s) for s in ([7], [51, 52, 53], [3, 5, 8])] == ["step 7", "steps 51-53", "steps 3, 5, 8"]


def test_curves_svg_draws_a_chart_per_metric_with_a_finite_value(tmp_path):
    from xml.etree import ElementTree

    from roll_lite.runtime.curves import write_curves

    path = write_curves(
        tmp_path / "curves.svg",
        {
            "reward/mean": [(1, 0.5), (2, float("nan")), (3, 0.75)],  # the nan is left out, the line goes on
            "actor/kl": [(1, 0.0)],  # one value: a chart with a range around it
            "eval/reward_mean": [(2, float("inf"))],  # nothing finite: no chart
            "perf/step_s": [(step, 0.1) for step in range(40)],  # many points: a line without marks
        },
    )
    svg = ElementTree.parse(path).getroot()  # well-formed
    ns = "{http://www.w3.org/2000/svg}"
    titles = [t.text for t in svg.iter(f"{ns}text") if t.get("font-size") == "13"]
    assert titles == ["reward/mean", "actor/kl", "perf/step_s"]
    lines = [line.get("points").split() for line in svg.iter(f"{ns}polyline")]
    assert [len(points) for points in lines] == [2, 1, 40]
    assert len(list(svg.iter(f"{ns}circle"))) == 3  # reward/mean's two and actor/kl's one
    assert write_curves(tmp_path / "none.svg", {"reward/mean": []}) is None and not (tmp_path / "none.svg").exists()
