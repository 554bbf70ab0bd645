"""roll-view (roll_lite/viewer/, docs/traces.md "roll-view"): the API's filters and trajectories over
traces written by TraceWriter, a run that is still training, bad input (no traces, a half-written
file, an older trace without columns, a path that is not a run directory), and docs/traces.md's
command as written. In-process but for that command; the page itself is checked in a browser by
tests/test_multi_turn_run.py::test_roll_view_shows_the_runs_trajectories_in_a_browser."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import doc_commands
import pyarrow.parquet as pq
import pytest

from roll_lite.runtime.traces import TraceWriter, trace_path
from roll_lite.viewer import cli
from roll_lite.viewer.runs import check_run_directory
from roll_lite.viewer.server import STATIC, Viewer

PROMPTS = [json.dumps([{"role": "user", "content": f"reverse {n}"}]) for n in ("12", "345")]


def rl_row(sample: int, reward: float, outcome: str, domain: str, versions: list[int], gap: float) -> dict:
    return {
        "sample": sample,
        "group": sample // 2,
        "prompt": PROMPTS[sample // 2],
        "response": f"answer {sample}",
        "response_ids": [5, 6, 7],
        "reward": reward,
        "reward_sources": [{"source": f"{domain}/exact", "score": reward, "outcome": outcome, "reason": None}],
        "advantage": reward - 0.5,
        "loss_mask": [1, 1, 1],
        "token_advantages": [reward - 0.5] * 3,
        "weight_versions": versions,
        "engine_log_probs": [-1.0, -2.0, -3.0],
        "log_prob_gap": [0.0, gap, -gap],
    }


def write_run(run_dir: Path, steps: int = 2) -> None:
    """Each step: 2 prompts x 2 samples; sample 3 timed out (math), step 2's sample 0 was sampled by
    weights one version behind (0, not 1), sample 1's log-probs are 0.5 apart."""
    writer = TraceWriter(run_dir / "traces", True, 0)
    for step in range(1, steps + 1):
        now = [step - 1] * 3
        writer.write(
            step,
            [
                rl_row(0, 1.0, "ok", "digits", [step - 2, *now[1:]] if step == 2 else now, 0.0),
                rl_row(1, 0.0, "ok", "digits", now, 0.5),
                rl_row(2, 1.0, "ok", "math", now, 0.0),
                rl_row(3, 0.0, "timed_out", "math", now, 0.0),
            ],
        )


def passed(viewer: Viewer, **query: str) -> list[tuple[int, int]]:
    return [(s["step"], s["sample"]) for s in viewer.samples(query)["rows"]]


def test_the_filters_pick_the_samples_by_outcome_reward_domain_staleness_gap_and_prompt(tmp_path):
    write_run(tmp_path)
    viewer = Viewer(tmp_path)
    run = viewer.run()
    assert [s["step"] for s in run["steps"]] == [1, 2] and not run["problems"] and run["message"] is None
    assert (run["outcomes"], run["domains"]) == (["ok", "timed_out"], ["digits", "math"])
    assert passed(viewer, step="2") == [(2, 0), (2, 1), (2, 2), (2, 3)]
    assert passed(viewer, outcome="timed_out") == [(1, 3), (2, 3)]
    assert passed(viewer, step="1", reward_min="0.5") == [(1, 0), (1, 2)]
    assert passed(viewer, step="1", reward_max="0.5", domain="digits") == [(1, 1)]
    assert passed(viewer, staleness_min="1") == [(2, 0)]  # step 2, sampled by version 0: 1 behind step 2's 1
    assert passed(viewer, gap_min="0.25") == [(1, 1), (2, 1)]
    key = viewer.samples({"step": "1"})["rows"][2]["prompt_key"]
    assert passed(viewer, prompt_key=key) == [(1, 2), (1, 3), (2, 2), (2, 3)]  # the prompt across steps
    assert viewer.samples({})["rows"][0]["prompt"] == "reverse 12"  # the chat messages' text
    with pytest.raises(ValueError, match="reward_min: not a number: 'high'"):
        viewer.samples({"reward_min": "high"})
    with pytest.raises(LookupError, match="step 9 has no readable trace"):
        viewer.samples({"step": "9"})


def test_a_trajectory_has_each_tokens_values_and_a_multi_turn_one_its_turns(tmp_path):
    turns = [
        {"text": "guess 8", "ids": [1, 2], "reply": "lower", "reply_ids": [3], "reward": 0.0, "weight_version": 0},
        {"text": "guess 4", "ids": [4], "reply": None, "reply_ids": None, "reward": 1.0, "weight_version": 0},
    ]
    row = {
        "sample": 0,
        "prompt": "Guess 1-16.",
        "response_ids": [1, 2, 3, 4],
        "reward": 1.0,
        "advantage": 0.5,
        "loss_mask": [1, 1, 0, 1],
        "token_advantages": [0.5, 0.5, 0.0, 0.5],
        "weight_versions": [0, 0, -1, 0],
        "turns": turns,
        "end": "terminated",
    }
    TraceWriter(tmp_path / "traces", True, 0).write(1, [row])
    opened = Viewer(tmp_path).sample({"step": "1", "sample": "0"})
    assert [(p["kind"], p["turn"], len(p["tokens"])) for p in opened["parts"]] == [
        ("model", 1, 2),
        ("environment", 1, 1),
        ("model", 2, 1),
    ]
    reply = opened["parts"][1]
    assert reply["text"] == "lower" and reply["tokens"][0] | {"text": None} == {
        "id": 3,
        "text": None,
        "advantage": 0.0,
        "gap": None,
        "logp": None,
        "version": -1,
        "trained": 0,
    }
    assert opened["parts"][2]["reward"] == 1.0 and opened["header"]["end"] == "terminated"
    assert opened["notes"] == ["the run has no config.yaml, so no tokenizer: tokens are shown as ids"]
    assert [t["text"] for t in opened["parts"][0]["tokens"]] == ["[1]", "[2]"]
    with pytest.raises(LookupError, match="step 1 traced no sample 4"):
        Viewer(tmp_path).sample({"step": "1", "sample": "4"})


def test_a_training_run_no_traces_then_a_half_written_step_then_an_older_one(tmp_path):
    (tmp_path / ".lock").write_text("123")  # what a starting run writes first
    check_run_directory(tmp_path)
    viewer = Viewer(tmp_path)
    assert "no traces yet" in viewer.run()["message"]
    write_run(tmp_path / "whole", steps=2)
    (tmp_path / "traces").mkdir()
    step_1 = trace_path(tmp_path / "whole" / "traces", 1).read_bytes()
    trace_path(tmp_path / "traces", 1).write_bytes(step_1[: len(step_1) // 2])  # killed mid-write
    run = viewer.run()
    assert run["steps"] == [] and "no step's trace reads yet" in run["message"]
    (problem,) = run["problems"]  # pyarrow's reason in the middle
    assert problem.startswith("step_000001.parquet does not read (") and problem.endswith("): skipped until it changes")
    trace_path(tmp_path / "traces", 1).write_bytes(step_1)  # complete now: read on the next look
    older = pq.read_table(trace_path(tmp_path / "whole" / "traces", 2)).drop_columns(["reward_sources", "loss_mask"])
    pq.write_table(older, trace_path(tmp_path / "traces", 2))
    run = viewer.run()
    assert [s["step"] for s in run["steps"]] == [1, 2] and run["message"] is None
    assert run["problems"] == [
        "step 2: its trace has no column(s) reward_sources, loss_mask (written by an older roll_lite?): "
        "those filters and colours are off for it"
    ]
    assert passed(viewer, outcome="timed_out") == [(1, 3)]  # step 2 has no outcomes to filter on
    assert len(viewer.sample({"step": "2", "sample": "1"})["parts"][0]["tokens"]) == 3
    trace_path(tmp_path / "traces", 2).unlink()  # a resume removed it
    assert [s["step"] for s in viewer.run()["steps"]] == [1]


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda p: p / "nowhere", "does not exist"),
        (lambda p: (p / "file.txt").write_text("x") and p / "file.txt", "is not a directory"),
        (lambda p: p, "is not a run directory: it has no traces/, metrics.jsonl, checkpoints/ or .lock"),
        (lambda p: write_run(p / "run", 1) or p / "run" / "traces", "is a traces folder: give the run directory above"),
    ],
)
def test_a_path_that_is_not_a_run_directory_is_one_line_and_exit_2(tmp_path, capsys, make, says):
    assert cli.main([str(make(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("roll-view: ") and says in err


def test_the_page_fetches_nothing_from_the_internet():
    for file in STATIC.iterdir():
        assert "//" not in file.read_text().replace("// ", ""), f"{file.name} names an address (no CDN: ship it)"


def test_the_docs_command_serves_the_page_and_the_api_on_loopback(tmp_path):
    """docs/traces.md's `roll-view ...` as written, from a folder holding that run directory."""
    argv = doc_commands.command("roll-view")
    write_run(tmp_path / argv[1], steps=1)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / argv[0]), *argv[1:]],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        line = server.stdout.readline()
        assert line.startswith(f"roll-view: {argv[1]} on http://127.0.0.1:"), line
        url = line.split(" on ")[1].split()[0]
        page = urllib.request.urlopen(url, timeout=10).read().decode()
        assert '<script src="/static/viewer.js">' in page
        for name in ("viewer.js", "viewer.css"):  # the page's files are served from the package
            assert urllib.request.urlopen(url + "static/" + name, timeout=10).read() == (STATIC / name).read_bytes()
        run = json.load(urllib.request.urlopen(url + "api/run", timeout=10))
        assert run["run"] == Path(argv[1]).name and run["steps"] == [{"step": 1, "samples": 4}]
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(url + "api/sample?step=1&sample=x", timeout=10)
        assert answer.value.code == 400 and "whole numbers" in json.load(answer.value)["error"]
    finally:
        server.terminate()
        server.wait(timeout=10)
