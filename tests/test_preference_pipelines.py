"""The preference pipelines end to end, from the docs' commands (docs/preferences.md) with small
overrides: a reward model whose final/ the reward worker loads as it is and GRPO trains against; DPO
with a reference worker and with precomputed reference log-probs (the same steps), resumed from a
checkpoint bit for bit; LoRA DPO with the actor as its own reference. The reward model's run and DPO's
precomputed run are on Ray; the others with workers.backend=local (one process, no Ray, bit for bit the same:
the resumed DPO run is compared with the Ray one)."""

import json
import re
import shlex
import sys
from pathlib import Path

import doc_commands
import pyarrow.parquet as pq
import pytest
import torch
from warm_driver import roll_train

REPO = Path(__file__).resolve().parents[1]
TINY = [
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.num_hidden_layers=2",
    "model.num_attention_heads=2",
    "model.num_key_value_heads=1",
    "workers.torch_threads=1",
]
SHORT = ["preference.steps=4", "preference.eval_every=2", "preference.batch_size=8"]
LOCAL = "workers.backend=local"


def docs_command(contains: str) -> list[str]:
    """The docs' one roll-train line that contains `contains` (for a config's own command, the line that is
    just `roll-train --config <it>`: docs/rewards.md runs configs/reward_model.yaml on other data too)."""
    lines = doc_commands.commands("roll-train", contains)
    (line,) = [line for line in lines if line == f"roll-train --config {contains}"] or lines
    return shlex.split(line)


def history(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def workdir(tmp_path):
    for name in ("configs", "data"):
        (tmp_path / name).symlink_to(REPO / name)
    return tmp_path


def test_reward_model_final_scores_as_trained_and_grpo_trains_against_it(workdir):
    result = roll_train(docs_command("configs/reward_model.yaml") + TINY + SHORT, workdir)
    run_dir = workdir / "outputs/rm_reverse_digits"
    records = history(run_dir)
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4] and "rm step 4/4" in result.stderr
    assert (
        all(0 <= records[step]["eval/rm/accuracy"] <= 1 for step in (0, 2, 4)) and "eval/rm/accuracy" not in records[1]
    )
    assert all(records[step]["rm/pairs"] == 8 and records[step]["rm/grad_norm"] > 0 for step in (1, 2, 3, 4))
    assert records[4]["eval/rm/loss"] != records[0]["eval/rm/loss"]
    pairs = traces(run_dir)  # each step's pairs (docs/traces.md)
    assert [(r["step"], r["sample"]) for r in pairs] == [(s, i) for s in (1, 2, 3, 4) for i in range(8)]
    assert all(r["chosen"] != r["rejected"] and r["prompt"] and r["chosen_ids"] != r["rejected_ids"] for r in pairs)

    # final/ is a plain transformers sequence classifier: the reward worker's RewardModel loads it as it is
    # and gives the held-out pairs the scores the run's last evaluation had.
    from roll_lite.config import PreferenceConfig
    from roll_lite.data.pairs import load_pair_files
    from roll_lite.model.tokenizer import load_tokenizer
    from roll_lite.rewards.reward_model import RewardModel, check_reward_model_folder

    final = run_dir / "final"
    assert json.loads((final / "config.json").read_text())["architectures"] == ["Qwen2ForSequenceClassification"]
    check_reward_model_folder(str(final), "reward.models")
    tokenizer = load_tokenizer(str(final))
    pairs, _ = load_pair_files([str(REPO / "data/reverse_digits_pairs/eval.jsonl")], "f", PreferenceConfig(), tokenizer)
    model = RewardModel(str(final), tokenizer)
    assert model.same_tokenizer
    scores = [
        s.value
        for s in model.score(
            [""] * 2 * len(pairs),
            [""] * 2 * len(pairs),
            [ids for pair in zip(pairs.chosen, pairs.rejected) for ids, _ in pair],
        )
    ]
    gaps = torch.tensor(scores[0::2], dtype=torch.float64) - torch.tensor(scores[1::2], dtype=torch.float64)
    assert gaps.mean().item() == pytest.approx(records[4]["eval/rm/score_gap"], rel=1e-4, abs=1e-5)
    assert (gaps > 0).double().mean().item() == pytest.approx(records[4]["eval/rm/accuracy"], abs=1.5 / len(pairs))

    # The docs' GRPO command against it: the reward worker scores every response with the model.
    roll_train(
        docs_command("outputs/rm_reverse_digits/final: 1.0")
        + TINY
        + ["steps=1", "sft.steps=0", "rollout.prompts_per_step=2", "rollout.num_samples=2", "eval_every=100", LOCAL],
        workdir,
    )
    (step,) = [r for r in history(workdir / "outputs/grpo_from_rm") if r["step"] == 1]
    assert (
        step["reward/model:rm_reverse_digits"] == pytest.approx(step["reward/mean"])
        and step["reward/model:rm_reverse_digits/failed"] == 0
    )


def dpo(workdir, run_name, *overrides, fresh=False):
    # The SFT model of the docs' first command is replaced by a fresh tiny one (model.pretrained_path=null).
    roll_train(
        docs_command("configs/dpo.yaml")
        + TINY
        + SHORT
        + ["model.pretrained_path=null", f"run_name={run_name}", "workers.backend=ray", *overrides],
        workdir,
        fresh,
    )
    return history(workdir / "outputs" / run_name)


def test_dpo_with_a_reference_worker_or_precomputed_log_probs_and_resumed_bit_for_bit(workdir):
    worker = dpo(workdir, "worker", LOCAL)
    precomputed = dpo(workdir, "precomputed", "preference.reference=precomputed", "checkpoint.every=2", fresh=True)
    # Step 0: the policy is the reference, so every implicit reward is 0 and no pair is won.
    for records in (worker, precomputed):
        assert records[0]["eval/dpo/rewards/margins"] == 0 and records[0]["eval/dpo/rewards/accuracies"] == 0
        assert records[0]["eval/dpo/preference_loss"] == pytest.approx(0.6931471805599453)  # log 2
    # Then the same steps: the reference's log-probs come from the same weights either way (float32, other batches).
    for step in (1, 2, 3, 4):
        for name in ("dpo/loss", "dpo/rewards/margins", "dpo/logps/chosen"):
            assert precomputed[step][name] == pytest.approx(worker[step][name], rel=1e-4, abs=1e-6), (step, name)
    assert worker[4]["eval/dpo/rewards/margins"] != 0  # the policy moved away from the reference

    # Resumed from step 2 into another run directory: the precomputed log-probs come back from the
    # checkpoint, and steps 3 and 4 are the uninterrupted run's, bit for bit.
    checkpoint = workdir / "outputs/precomputed/checkpoints/step_2"
    assert (checkpoint / "reference_logps.pt").is_file()
    resumed = dpo(workdir, "resumed", "preference.reference=precomputed", f"resume={checkpoint}", LOCAL)
    assert [r["step"] for r in resumed] == [0, 1, 2, 3, 4]  # the history up to step 2 comes with the checkpoint
    assert [learning(r) for r in resumed] == [learning(r) for r in precomputed]
    # its traces: steps 3 and 4 (1 and 2 are the other run directory's), the uninterrupted run's pairs
    assert traces(workdir / "outputs/resumed") == [r for r in traces(workdir / "outputs/precomputed") if r["step"] > 2]


def traces(run_dir: Path) -> list[dict]:
    return pq.read_table(run_dir / "traces").to_pylist()


def learning(record: dict) -> dict:
    """A step's record without its timings."""
    return {name: value for name, value in record.items() if not name.startswith("perf/") and name != "time"}


def test_lora_dpo_uses_the_actor_without_adapters_as_reference(workdir):
    records = dpo(
        workdir,
        "lora",
        "actor.lora.rank=4",
        "preference.loss=ipo",
        "preference.nll_coef=0.1",
        "preference.steps=2",
        LOCAL,
    )
    assert records[0]["eval/dpo/rewards/margins"] == 0  # lora_B starts at zero: adapters off = on
    assert records[2]["eval/dpo/rewards/margins"] != 0 and records[2]["dpo/nll_loss"] > 0
    assert (workdir / "outputs/lora/final/adapter_model.safetensors").is_file()


def test_the_chain_example_stages_are_valid_configs_and_its_scorer_reads_a_policy(tmp_path, monkeypatch):
    # The full chain (examples/preferences/chain.py, ~15 min) ran for docs/preferences.md; here its
    # stages' arguments load as configs, and the held-out scorer answers with a policy folder.
    sys.path.insert(0, str(REPO / "examples/preferences"))
    import chain

    from roll_lite.config import ConfigError, load_config
    from roll_lite.model.modeling import build_causal_lm
    from roll_lite.model.tokenizer import build_char_tokenizer

    monkeypatch.chdir(REPO)
    for smoke in (False, True):
        for name, arguments in chain.stages(smoke).items():
            if name == "grpo_rm":  # its reward model is the chain's earlier stage
                with pytest.raises(ConfigError, match="no such folder 'outputs/chain_rm/final'"):
                    load_config(REPO / arguments[1], arguments[2:])
                continue
            config = load_config(REPO / arguments[1], arguments[2:])
            assert config.run_name.startswith("chain_"), name
    # docs/preferences.md's stage table shows the commands the script runs, in order
    section = (REPO / "docs/preferences.md").read_text().split("## The chain, on a CPU")[1].split("\n## ")[0]
    shown = [shlex.split(code) for code in re.findall(r"`(roll-train --config [^`]+)`", section)]
    assert shown == [["roll-train", *arguments, f"seed={chain.SEED}"] for arguments in chain.stages(False).values()]
    tokenizer = build_char_tokenizer()
    build_causal_lm(
        dict(
            model_type="qwen2",
            vocab_size=len(tokenizer),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        ),
        seed=0,
    ).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    assert chain.held_out_accuracy(tmp_path) == 0.0  # a random model answers none of the 64
