"""data.source: rows and scores from a package (reasoning-gym), not a file (roll_lite/data/sources.py,
roll_lite/rewards/reasoning_gym_reward.py): seeded rows, held-out rows disjoint from training, the
package's own scorer, config errors naming the key, the sampler resuming, the SFT warm start on the
training rows only (sft.from_data_source), and one run (in process, workers.backend=local) routing by
domain with eval."""

import json
from pathlib import Path

import pytest

pytest.importorskip("reasoning_gym")

from roll_lite.cli import main  # noqa: E402
from roll_lite.config import ConfigError, DataConfig, load_config  # noqa: E402
from roll_lite.data.domain_sampler import training_sampler  # noqa: E402
from roll_lite.data.prompts import prepare_datasets  # noqa: E402
from roll_lite.data.sft import prepare_sft_datasets  # noqa: E402
from roll_lite.data.sources import EVAL_SEED_OFFSET, reasoning_gym_rows  # noqa: E402
from roll_lite.model.tokenizer import build_char_tokenizer  # noqa: E402
from roll_lite.rewards import get_reward  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# one-digit sums of two terms: few distinct questions, so a held-out seed repeats training questions
SMALL = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+"]}
MULTI_TURN = "pipeline=roll_lite.pipelines.multi_turn:MultiTurnPipeline"
COMPOSITE = {
    "datasets": [
        {"name": "basic_arithmetic", "weight": 1, "config": SMALL},
        {"name": "leg_counting", "weight": 1, "config": {"min_animals": 1, "max_animals": 1}},
    ]
}


def source(task="basic_arithmetic", args=SMALL, size=40, eval_size=40, **options):
    return DataConfig(
        source="reasoning_gym",
        source_task=task,
        source_args=args,
        source_size=size,
        source_eval_size=eval_size,
        **options,
    )


def test_rows_are_seeded_held_out_rows_are_disjoint_and_the_package_scores_them():
    tokenizer = build_char_tokenizer()
    first = prepare_datasets(source(), tokenizer, seed=3)
    assert first.train.prompts == prepare_datasets(source(), tokenizer, seed=3).train.prompts
    assert first.train.prompts != prepare_datasets(source(), tokenizer, seed=4).train.prompts
    held_out = set(first.eval.prompts)
    assert held_out and not held_out & set(first.train.prompts)
    unfiltered = reasoning_gym_rows("basic_arithmetic", SMALL, 3 + EVAL_SEED_OFFSET, 40)
    assert {row["prompt"] for row in unfiltered} & set(first.train.prompts)  # so the filter had work to do
    assert any("held out" in note for note in first.notes)
    score = get_reward("reasoning_gym")
    for answer, extra in zip(first.eval.answers[:5], first.eval.extras[:5]):
        assert extra["domain"] == "basic_arithmetic"
        assert score(answer, answer, extra) == 1.0
        assert score(str(int(answer) + 1), answer, extra) == 0.0
    with pytest.raises(ValueError, match="no source_task"):
        score("1", "1", {"domain": "x"})


def test_the_stream_of_rows_resumes_exactly_from_a_sampler_checkpoint():
    weights = {"basic_arithmetic": 1.0, "leg_counting": 3.0}
    data = source("composite", COMPOSITE, size=30, eval_size=0, domain_weights=weights, domain_key="task")
    rows = prepare_datasets(data, build_char_tokenizer(), seed=0).train
    assert {extra["task"] for extra in rows.extras} == {"basic_arithmetic", "leg_counting"}  # data.domain_key
    sampler = training_sampler(data, rows, seed=0)
    sampler.draw(7)
    state = sampler.state_dict()
    rest = sampler.draw(9)
    again = prepare_datasets(data, build_char_tokenizer(), seed=0).train  # a resumed run generates them anew
    resumed = training_sampler(data, again, seed=0)
    resumed.load_state_dict(state)
    assert resumed.draw(9) == rest and again.prompts == rows.prompts


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["data.source=nope", "data.source_task=basic_arithmetic"], "data.source"),
        (["data.source_task=no_such_task"], "data.source_task"),
        (["data.source_task=basic_arithmetic", "data.source_args={bogus: 1}"], "data.source_args"),
        (["data.source_task=basic_arithmetic", "data.source_args={min_terms: 5, max_terms: 2}"], "data.source_args"),
        (["data.source_task=basic_arithmetic", "data.source_size=0"], "data.source_size"),
        (["data.source_task=basic_arithmetic", "data.train_files=x.jsonl"], "data.train_files"),
        ([], "data.source_task"),
        (["data.source_task=basic_arithmetic", "data.extra_keys=[]"], "data.extra_keys"),
        (["data.source_task=basic_arithmetic", "environment.name=guess_the_number", MULTI_TURN], "data.source"),
    ],
)
def test_bad_source_keys_are_config_errors_naming_the_key(overrides, key):
    with pytest.raises(ConfigError, match=rf"^{key}: "):
        load_config(None, ["data.source=reasoning_gym", *overrides])


def test_a_prompt_too_long_for_the_model_names_the_source(tmp_path, capsys):
    source = ["data.train_files=[]", "data.eval_files=[]", "data.extra_keys=null", "data.source=reasoning_gym"]
    source += ["data.source_task=leg_counting", "data.source_size=4", "data.max_prompt_length=null"]
    where = [f"output_dir={tmp_path}", "run_name=long", "sft.steps=0", "model.max_position_embeddings=64"]
    assert main(["--config", str(REPO / "configs/grpo.yaml"), *source, *where]) == 2
    error = capsys.readouterr().err
    assert "rollout.max_new_tokens: the longest prompt (" in error and "tokens, data.source) + " in error


def test_a_run_trains_and_evaluates_on_a_reasoning_gym_task(tmp_path):
    tiny = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_hidden_layers=2"]
    tiny += [
        "model.max_position_embeddings=256",
        "model.num_attention_heads=2",
        "model.num_key_value_heads=1",
        "sft.steps=0",
        "workers.torch_threads=1",
    ]
    data = ["data.train_files=[]", "data.eval_files=[]", "data.extra_keys=null", "data.source=reasoning_gym"]
    data += ["data.source_task=composite"]
    data += [f"data.source_args={json.dumps(COMPOSITE)}", "data.source_size=16", "data.source_eval_size=4"]
    data += ["data.domain_weights={basic_arithmetic: 1.0, leg_counting: 1.0}", "data.max_prompt_length=400"]
    run = ["reward.functions={reasoning_gym: 1.0}", "rollout.prompts_per_step=2", "rollout.num_samples=2"]
    run += ["steps=2", "eval_every=2", "workers.backend=local", f"output_dir={tmp_path}", "run_name=rg"]
    assert main(["--config", str(REPO / "configs/grpo.yaml"), *tiny, *data, *run]) == 0
    records = [json.loads(line) for line in (tmp_path / "rg/metrics.jsonl").read_text().splitlines()]
    scored = [record for record in records if "reward/reasoning_gym" in record]
    held_out = [record for record in records if "eval/reward/reasoning_gym" in record]
    assert len(scored) == 2 and len(held_out) == 2  # eval at the start and at step 2
    for record in scored + held_out:  # the package's scorer answered every call
        assert record.get("reward/reasoning_gym/failed", 0) == record.get("eval/reward/reasoning_gym/failed", 0) == 0


def test_the_sft_warm_start_takes_the_training_rows_rendered_as_rl_prompts_and_never_held_out_ones():
    tokenizer = build_char_tokenizer()
    config = load_config(
        None,
        ["data.source=reasoning_gym", "data.source_task=basic_arithmetic", f"data.source_args={json.dumps(SMALL)}"]
        + ["data.source_size=40", "data.source_eval_size=40", "sft.from_data_source=true", "sft.steps=1"],
    )
    rl = prepare_datasets(config.data, tokenizer, seed=3)
    sft = prepare_sft_datasets(config.sft, tokenizer, config.data, seed=3).train
    assert len(sft) == len(rl.train.prompts) == 40
    held_out = set(rl.eval.prompts)
    unfiltered = reasoning_gym_rows("basic_arithmetic", SMALL, 3 + EVAL_SEED_OFFSET, 40)
    assert len(held_out) < len(unfiltered)  # the held-out seed repeats training questions, and they were left out
    sft_prompts = set()
    for ids, mask, prompt_ids, answer in zip(sft.input_ids, sft.target_masks, rl.train.prompt_ids, rl.train.answers):
        start = mask.index(1)
        assert ids[:start] == prompt_ids  # the RL prompt's own tokens
        assert ids[start:] == tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        sft_prompts.add(tokenizer.decode(ids[:start], skip_special_tokens=True))
    assert sft_prompts == set(rl.train.prompts) and not sft_prompts & held_out


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["data.source=null"], "sft.from_data_source"),
        (["sft.train_files=x.jsonl"], "sft.train_files"),
        (["sft.apply_chat_template=true"], "sft.apply_chat_template"),
    ],
)
def test_bad_sft_source_keys_are_config_errors_naming_the_key(overrides, key):
    source = ["data.source=reasoning_gym", "data.source_task=basic_arithmetic", "sft.from_data_source=true"]
    with pytest.raises(ConfigError, match=rf"^{key}: "):
        load_config(None, [*source, "sft.steps=1", *overrides])
