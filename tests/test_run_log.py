"""The RL step line (pipelines/run_log.py) from a step's metrics, one case per mode: a step without reward
signal says so, each feature shows its own metric, and a mixed-domain run shows its rewards per domain,
never one mean over sources on different scales. The signal metrics themselves: pipelines/advantages.py."""

import torch

from pipelines.advantages import reward_signal_metrics
from pipelines.run_log import held_out, held_out_change, progress_line

BASE = {"reward/mean": 0.25, "actor/kl": 0.0, "actor/entropy": 0.5, "actor/grad_norm": 1.5, "perf/step_s": 0.13}


def line(**metrics) -> str:
    return progress_line(3, 20, {**BASE, **{key.replace("__", "/"): value for key, value in metrics.items()}})


def test_the_reward_signal_counts_the_groups_whose_scored_rewards_are_all_equal():
    scores, groups = torch.tensor([0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.5, 0.25]), torch.arange(8) // 2
    assert reward_signal_metrics(scores, groups, None) == {
        "advantage/groups": 4.0,
        "advantage/equal_reward_groups": 2.0,  # (0, 0) and (1, 1)
    }
    # reward.on_failure=drop: a group left with one scored row, or none, has no signal either
    valid = torch.tensor([True, True, True, False, True, True, False, False])
    assert reward_signal_metrics(scores, groups, valid)["advantage/equal_reward_groups"] == 4.0


def test_a_step_without_signal_says_so_and_one_with_some_does_not():
    none = {"advantage/groups": 4.0, "advantage/equal_reward_groups": 4.0}
    assert line(**{"reward__mean": 0.0, "actor__grad_norm": 0.0}, **none) == (
        "step 3/20 | reward 0.000 | kl 0 | entropy 0.5 | grad 0 | s 0.13 | "
        "all 4 groups had equal rewards: no gradient this step"
    )
    # a gradient from elsewhere (PPO's critic, a KL loss, a teacher): the groups are still named
    assert line(**none).endswith("| grad 1.5 | s 0.13 | all 4 groups had equal rewards")
    some = {"advantage/groups": 4.0, "advantage/equal_reward_groups": 3.0}
    assert line(**some) == "step 3/20 | reward 0.250 | kl 0 | entropy 0.5 | grad 1.5 | s 0.13"


def test_each_feature_shows_its_own_metric():
    assert "| distill kl 0.512 |" in line(**{"distill/reverse_kl": 0.5123})  # distill.signal=advantage
    assert "| distill kl 0.0312 |" in line(**{"actor/distill_kl": 0.03125})  # reverse_kl, top_k_forward_kl
    assert "| staleness 0.438 |" in line(**{"rollout/staleness": 1, "rollout/staleness_token_mean": 0.4375})
    assert "| staleness 1 |" in line(**{"rollout/staleness": 1})  # rollout.async_steps
    assert "staleness" not in line(**{"rollout/staleness": 0})  # lockstep
    code = {"reward/code": 0.4, **{f"reward/code/programs/{v}": n for v, n in (("passed", 3.0), ("error", 0.0))}}
    code["reward/code/programs/wrong_answer"] = 29.0
    assert "| programs: 3 passed, 29 wrong_answer |" in line(**code)  # a verdict no program had is left out
    routed = {"reward/python/code/programs/passed": 2.0, "reward/python/code/programs/error": 6.0}
    assert "| python programs: 2 passed, 6 error |" in line(**routed)  # reward.domains: the code domain's
    sources = {"reward/model:rm_reverse_digits": -0.3125, "reward/judge:judge_decrement": 0.75}
    assert "| model:rm_reverse_digits -0.312 | judge:judge_decrement 0.750 |" in line(**sources)
    sources.update({"reward/judge:judge_decrement/unparseable": 3.0, "reward/judge:judge_decrement/failed": 0.0})
    assert "| judge:judge_decrement 0.750 (3 unparseable) |" in line(**sources)  # the rows it did not score
    assert "| unscored 5 |" in line(**{"reward/unscored": 5.0}) and "unscored" not in line(**{"reward/unscored": 0.0})
    assert "| informative 0.75 |" in line(**{"dapo/informative_groups": 0.75})
    assert "| turns 3.25 | tool calls 0.5 |" in line(**{"env/turns": 3.25, "env/tool_calls": 0.5})


def test_a_mixed_domain_run_shows_each_domains_reward_and_no_mean_over_them():
    step = {
        "reward/reverse/exact_answer": 0.5,
        "reward/reverse/mean": 0.5,
        "reward/increment/model:rm_increment": -1.25,
        "reward/increment/mean": -1.25,
        "reward/decrement/judge:judge_decrement": 0.375,
        "reward/decrement/mean": 0.375,
        "eval/reward_mean": -0.125,  # over an exact-answer rate, a logit and a yes-rate: not shown
        "eval/reward/reverse/mean": 0.25,
        "eval/reward/increment/mean": -0.75,
        "eval/reward/decrement/mean": 0.125,
    }
    text = line(**step)
    assert text.startswith(
        "step 3/20 | reward decrement 0.375, increment -1.250, reverse 0.500 | "  # by name
        "held-out decrement 0.125, increment -0.750, reverse 0.250 | kl 0"
    ), text
    assert "0.250 |" not in text.split("| held-out")[0] and "-0.125" not in text  # neither reward/mean nor eval's
    first = {"eval/reward_mean": 0.0, "eval/reward/reverse/mean": 0.0, "eval/reward/increment/mean": -2.0}
    assert held_out_change(first, step) == (
        "decrement - -> 0.125, increment -2.000 -> -0.750, reverse 0.000 -> 0.250 (start -> end)"
    )
    assert held_out({"eval/reward_mean": 0.09375}) == "0.094" and held_out({}) == "-"
    assert held_out_change({"eval/reward_mean": 0.09375}, {"eval/reward_mean": 0.890625}) == (
        "0.094 at start -> 0.891 at the end"  # docs/quickstart.md's line
    )
