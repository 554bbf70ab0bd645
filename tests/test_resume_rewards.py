"""A run scored by every kind of source, SIGKILLed and resumed, equals the uninterrupted run bit for
bit: two domains drawn by data.domain_weights, one scored by a rule, a reward model and a greedy LLM
judge, the other by programs run in the sandbox. Nothing of the scoring (the judge's replies, the
reward model's scores, the sandbox's verdicts) or of the domain draws may depend on the process."""

import json
import shutil

import pytest
from test_judge import save_judge
from test_resume import LOCAL, REPO, TINY, assert_same_trajectory, metrics, run, run_until
from test_reward_model import save_reward_model

from roll_lite.checkpoint import layout

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
STEPS = 4  # checkpoints at 2 and 4; the kill comes once step 2's is written


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mixed")
    digits = [json.loads(line) for line in (REPO / "data/reverse_digits/train.jsonl").read_text().splitlines()[:8]]
    code = [json.loads(line) for line in (REPO / "data/integer_functions/train.jsonl").read_text().splitlines()[:8]]
    rows = [{**row, "domain": "digits"} for row in digits] + [{**row, "domain": "code"} for row in code]
    (folder / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    judge, model = save_judge(folder / "judge"), save_reward_model(folder / "rm")
    return [
        f"data.train_files={folder / 'train.jsonl'}",
        "data.eval_files=[]",
        "data.extra_keys=null",
        "data.max_prompt_length=40",
        "data.domain_weights={digits: 1.0, code: 2.0}",
        f"reward.domains={{digits: {{functions: {{token_accuracy: 1.0}}, models: {{{model}: 0.5}}, "
        f"judges: {{{judge}: 0.5}}}}, code: {{code: 1.0}}}}",
        "reward.judge_max_new_tokens=4",
        "reward.code_extract=whole",
        "reward.sandbox.wall_s=2",
    ]


def command(setup, output, run_name: str, *extra: str) -> list[str]:
    import sys

    return [
        sys.executable,
        "-m",
        "roll_lite.cli",
        "--config",
        str(REPO / "configs/grpo.yaml"),
        *TINY,
        *setup,
        f"steps={STEPS}",
        f"output_dir={output}",
        f"run_name={run_name}",
        "workers.backend=ray",  # the reference run on Ray; LOCAL in `extra` overrides it
        *extra,
    ]


def test_a_judged_and_sandboxed_run_killed_and_resumed_equals_the_uninterrupted_one(setup, tmp_path):
    run(command(setup, tmp_path, "ref"), fresh=True)
    reference = metrics(tmp_path / "ref")
    steps = [r for r in reference if "reward/mean" in r]
    assert any("reward/code/code" in r for r in steps) and any("reward/digits/judge:judge" in r for r in steps)
    # the uninterrupted run on Ray, the killed and resumed one in one process (workers.backend=local)
    # killed as soon as step 2's checkpoint is committed: the resume trains steps 3 and 4
    run_until(
        command(setup, tmp_path, "killed", LOCAL), f"checkpoint {layout.step_dir(tmp_path / 'killed', 2)} written in"
    )
    assert layout.committed_steps(tmp_path / "killed") == [2]
    resumed = run(command(setup, tmp_path, "killed", LOCAL))
    assert "resumed from" in resumed.stderr
    assert_same_trajectory(metrics(tmp_path / "killed"), reference)
