"""The loss-invariance checker passes the built-in losses and catches the usual mistakes."""

import functools
import os
import shlex
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from forked_main import run_as_main

from roll_lite.data.pairs import PairData, build_pair_batch
from roll_lite.loss import (
    AGG_MODES,
    BUILTIN_LOSSES,
    agg_loss,
    bradley_terry_loss_func,
    dpo_loss_func,
    mask_stats,
    masked_sum,
    pair_rows,
)
from roll_lite.loss.checker import LossInvarianceError, check_loss_invariance, main


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("name", sorted(BUILTIN_LOSSES))
def test_builtin_losses_pass(name, mode):
    factory, keys = BUILTIN_LOSSES[name]
    report = check_loss_invariance(factory(mode, seq_len_norm=24), keys, tolerance=1e-10)
    assert report.passed and report.worst < 1e-12
    assert len(report.rows) == 8


def micro_batch_masked_mean(batch, output):
    # The classic bug: normalising by the micro-batch's own token count.
    mask = batch["response_mask"]
    return -masked_sum(output["log_probs"] * batch["advantages"], mask) / mask.sum().clamp(min=1), {}


def stray_mask_loss(batch, output):
    # Policy loss is fine, but a second term is averaged over a mask that is not in loss_mask_keys.
    stats = mask_stats(batch.meta_info, "response_mask")
    pg = agg_loss(-output["log_probs"] * batch["advantages"], batch["response_mask"], "token-mean", **stats)
    kl_mask = batch["kl_mask"]
    kl = masked_sum(output["log_probs"] - batch["ref_log_probs"], kl_mask) / kl_mask.sum().clamp(min=1)
    return pg + 0.1 * kl, {}


def test_local_normalisation_is_caught_with_its_cause():
    with pytest.raises(LossInvarianceError, match="normalises by the micro-batch's own loss_mask.sum"):
        check_loss_invariance(micro_batch_masked_mean, ["response_mask"])


def test_mask_outside_loss_mask_keys_is_caught_by_name():
    from roll_lite.loss.checker import random_rl_batch

    data = random_rl_batch(mask_keys=["response_mask", "kl_mask"])
    report = check_loss_invariance(stray_mask_loss, ["response_mask"], data=data, raise_on_failure=False)
    assert not report.passed
    assert any(
        f.startswith("undeclared mask: loss_func reads ['kl_mask'], not in loss_mask_keys ['response_mask']")
        for f in report.failures
    )
    # Declared properly, the same data passes with a correct loss.
    factory, keys = BUILTIN_LOSSES["ppo_kl"]
    assert check_loss_invariance(factory(), keys, data=data).passed


# Mistakes that are partition-invariant (the same step under every D, A, packing) but wrong. The
# padded-width normaliser is one only when micro-batches keep the global width (trim_padding=False);
# with trimming, the default, the partitions see it too.


def attention_mask_loss(batch, output):
    # Aggregates over attention_mask (prompt tokens too) with response_mask's global count.
    stats = mask_stats(batch.meta_info, "response_mask")
    return agg_loss(-output["log_probs"] * batch["advantages"], batch["attention_mask"], "token-mean", **stats), {}


def unmasked_numerator_loss(batch, output):
    # Global denominator, but the numerator sums every position, prompt and padding included.
    n = mask_stats(batch.meta_info, "response_mask")["batch_num_tokens"]
    return (-output["log_probs"] * batch["advantages"]).sum() / n, {}


def padded_width_loss(batch, output):
    # Dr. GRPO's constant taken from the padded width: the same in every micro-batch of a step.
    mask = batch["response_mask"]
    stats = mask_stats(batch.meta_info, "response_mask")
    return agg_loss(
        -output["log_probs"] * batch["advantages"],
        mask,
        "seq-mean-token-sum-norm",
        **stats,
        seq_len_norm=mask.shape[-1],
    ), {}


def metric_over_attention_mask(batch, output):
    stats = mask_stats(batch.meta_info, "response_mask")
    loss = agg_loss(-output["log_probs"] * batch["advantages"], batch["response_mask"], "token-mean", **stats)
    return loss, {"tokens@sum": batch["attention_mask"].sum()}


@pytest.mark.parametrize(
    "loss_func, expected",
    [
        (attention_mask_loss, ["undeclared mask: loss_func reads ['attention_mask']", "unmasked numerator:"]),
        (
            unmasked_numerator_loss,
            [
                "unmasked numerator: the loss or gradient changes when values outside the declared "
                "masks ['response_mask'] change: 'log_probs' ("
            ],
        ),
        (padded_width_loss, ["partitions: the step under", "padded-width normaliser: the loss changes by"]),
        (metric_over_attention_mask, ["undeclared mask: loss_func reads ['attention_mask']"]),
    ],
)
def test_partition_invariant_mistakes_fail_with_one_line_each(loss_func, expected):
    report = check_loss_invariance(loss_func, ["response_mask"], raise_on_failure=False)
    if loss_func is not padded_width_loss:
        assert report.worst < 1e-12  # every partition agrees: only the new checks can see these
    assert not report.passed and len(report.failures) == len(expected)
    for failure, start in zip(report.failures, expected):
        assert failure.startswith(start) and "\n" not in failure, failure
    if loss_func is unmasked_numerator_loss:
        assert "'advantages' (" in report.failures[0]


def test_undeclared_masks_can_be_allowed_explicitly():
    assert check_loss_invariance(metric_over_attention_mask, ["response_mask"], allow_undeclared_masks=True).passed
    assert main(["tests.test_invariance:metric_over_attention_mask", "--allow-undeclared-masks"]) == 0


def test_cli_names_each_failure_in_one_line(capsys):
    assert main(["tests.test_invariance:unmasked_numerator_loss"]) == 1
    out = capsys.readouterr().out
    assert "PASS" not in out
    fails = [line for line in out.splitlines() if line.startswith("FAIL ")]
    assert len(fails) == 1 and "unmasked numerator" in fails[0]
    assert main(["tests.test_invariance:padded_width_loss"]) == 1
    assert "\nFAIL padded-width normaliser" in capsys.readouterr().out


def test_a_loss_func_returning_a_bare_tensor_is_named():
    with pytest.raises(TypeError, match=r"must return \(loss, metrics\).*returned a Tensor"):
        check_loss_invariance(lambda batch, output: output["log_probs"].sum())


def test_cli_exit_codes_and_table(capsys):
    assert main(["tests.test_invariance:micro_batch_masked_mean"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "D=2 A=2 packed" in out and "likely cause" in out
    assert main(["no_such_module:f"]) == 2
    assert main(["roll_lite.loss:AGG_MODES"]) == 2


def test_cli_entry_point_passes_a_builtin():
    # `python -c` forked where torch's and transformers' imports are done (~5 CPU s less, tests/forked_main.py)
    code = "from roll_lite.loss import ppo_policy_loss_func; loss = ppo_policy_loss_func('seq-mean-token-mean')"
    result = run_as_main(
        [
            "-c",
            f"{code}; import sys; sys.modules['user_loss'] = sys.modules[__name__]; "
            "from roll_lite.loss.checker import main; raise SystemExit(main(['user_loss:loss']))",
        ],
        cwd=os.getcwd(),
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS: worst relative deviation" in result.stdout


def test_the_custom_loss_example_passes():
    from examples.custom_loss.pipeline import CappedAdvantagePipeline, capped_loss

    for mode in AGG_MODES[:3]:
        assert check_loss_invariance(functools.partial(capped_loss, loss_agg_mode=mode), ["response_mask"]).passed
    from roll_lite.pipelines.ppo import PPOPipeline

    assert CappedAdvantagePipeline.loss_func is not PPOPipeline.loss_func


@pytest.mark.parametrize("mode", AGG_MODES)
def test_value_and_sft_losses_pass(mode):
    from roll_lite.loss import sft_loss_func, value_loss_func

    report = check_loss_invariance(
        value_loss_func(mode, clip_range=0.5, seq_len_norm=24), head="value", tolerance=1e-10
    )
    assert report.passed and report.worst < 1e-12
    if mode == "token-mean":
        assert check_loss_invariance(sft_loss_func(), tolerance=1e-10).worst < 1e-12


def test_the_docs_custom_loss_snippet_passes_the_checker():
    # The "def my_loss" block of docs/custom-losses.md (the README links to it), run as written.
    import doc_commands

    blocks = doc_commands.python_blocks_defining("my_loss")
    assert {block.path for block in blocks} == {"docs/custom-losses.md"}
    for block in blocks:
        namespace = {}
        exec(compile(block.body, block.path, "exec"), namespace)
        assert check_loss_invariance(namespace["my_loss"], ["response_mask"]).passed, block.path


def test_the_checker_computes_on_one_thread_and_gives_the_callers_threads_back():
    """With two intra-op threads, the float32 math inside HF's float64 model (RoPE, RMSNorm) rounded
    otherwise in about 1 process in 12, and the docs' correct loss failed at 5.8e-05 (tolerance 1e-9)."""
    import torch

    threads_seen = []

    def recording_loss(batch, output):
        threads_seen.append(torch.get_num_threads())
        return micro_batch_masked_mean(batch, output)

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(LossInvarianceError):
            check_loss_invariance(recording_loss, ["response_mask"])
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert threads_seen and set(threads_seen) == {1}


# Pair losses as the pipelines build them (pipelines/dpo.py, reward_model.py), checked as the pipelines run
# them: on preference pairs (--pairs), declared as build_pair_batch declares a pipeline's batches.
pair_dpo = dpo_loss_func("dpo", beta=0.5, label_smoothing=0.1, nll_coef=0.3)
pair_ipo = dpo_loss_func("ipo", beta=0.5)
pair_simpo = dpo_loss_func("simpo", beta=2.0, label_smoothing=0.1, nll_coef=0.3, simpo_gamma=0.4)
pair_bradley_terry = bradley_terry_loss_func(center_coef=0.05)
ONE_PAIR = PairData([([1, 2], [0, 1])], [([1, 3], [0, 1])])
PIPELINE_MASK_KEYS = ",".join(build_pair_batch(ONE_PAIR, pad_token_id=0).meta_info["loss_mask_keys"])


def local_mean_dpo(batch, output):
    # DPO over the micro-batch's own pair count: right for one micro-batch, wrong for a step of several.
    chosen, rejected = pair_rows(batch)
    response = batch["chosen_mask"].bool() | batch["rejected_mask"].bool()
    log_ratios = torch.where(response, output["log_probs"], 0.0).sum(-1) - batch["reference_logps"]
    return -F.logsigmoid(0.1 * (log_ratios[chosen] - log_ratios[rejected])).mean(), {}


@pytest.mark.parametrize(
    "name, head",
    [
        ("pair_dpo", "log_probs"),
        ("pair_ipo", "log_probs"),
        ("pair_simpo", "log_probs"),
        ("pair_bradley_terry", "score"),
    ],
)
def test_pair_losses_pass_with_the_pipelines_declaration(name, head, capsys):
    """The pipelines once declared only chosen_mask, and the checker then failed a correct DPO with
    "undeclared mask ... ['rejected_mask']" and "unmasked numerator ... 'log_probs'"."""
    assert main([f"tests.test_invariance:{name}", "--pairs", "--head", head, "--mask-keys", PIPELINE_MASK_KEYS]) == 0
    out = capsys.readouterr().out
    assert "\nPASS: worst relative deviation" in out and "FAIL" not in out
    assert "D=2 budget=40 packed" in out  # a pair fits the budget: it is never split


def test_a_pair_loss_over_the_micro_batchs_own_pairs_fails_with_its_cause_first(capsys):
    assert main(["tests.test_invariance:local_mean_dpo", "--pairs", "--mask-keys", PIPELINE_MASK_KEYS]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if line.startswith("FAIL ")] == [lines[0]]
    assert lines[0].startswith("FAIL partitions: the step under ")
    assert lines[1].startswith("likely cause: loss_func does not use the global stats in meta_info")
    assert (
        "divides by the micro-batch's own pair count" in lines[1]
        and "'chosen_mask')['global_valid_samples']" in lines[1]
    )
    assert lines[-1].startswith("FAIL: worst relative deviation")
    # a correct DPO declared with chosen_mask alone reads a mask it does not declare
    assert main(["tests.test_invariance:pair_dpo", "--pairs", "--mask-keys", "chosen_mask"]) == 1
    fails = [line for line in capsys.readouterr().out.splitlines() if line.startswith("FAIL ")]
    assert fails[0].startswith("FAIL undeclared mask: loss_func reads ['rejected_mask'], not in loss_mask_keys")
    assert main(["tests.test_invariance:pair_dpo", "--pairs", "--mask-keys", "response_mask"]) == 2
    assert "a pair batch has no ['response_mask']; its masks: chosen_mask, rejected_mask, score_mask" in (
        capsys.readouterr().err
    )


def test_the_docs_pair_loss_passes_the_docs_command_run_as_written(tmp_path):
    """docs/custom-losses.md's my_pair_loss, saved where its command imports it from, and the command run
    verbatim with the console script from that directory, as a user runs it (the script's code in a forked
    process, tests/forked_main.py: its own argv, sys.path, cwd and environment, without PYTHONPATH)."""
    import doc_commands

    (block,) = doc_commands.python_blocks_defining("my_pair_loss")
    (line,) = doc_commands.commands("roll-check-loss", "--pairs")
    argv = shlex.split(line)
    module = argv[1].split(":")[0].split(".")
    package = tmp_path
    for name in module[:-1]:
        package = package / name
        package.mkdir()
        (package / "__init__.py").touch()
    (package / f"{module[-1]}.py").write_text(block.body)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    # forked where torch's and transformers' imports are done (~5 CPU s less); a new interpreter runs the
    # console script in tests/test_user_imports.py (the README's command)
    result = run_as_main([str(Path(sys.executable).parent / argv[0]), *argv[1:]], cwd=tmp_path, timeout=300, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "\nPASS: worst relative deviation" in result.stdout
