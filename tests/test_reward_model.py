"""Reward models (roll_lite/rewards/reward_model.py): a one-label sequence-classification model from a
local folder scores each response with its own tokenizer and chat template; what breaks costs rows,
not the run; a bad folder is a config error naming the key."""

import pytest
import torch
from roll_lite.workers.reward_worker import RewardWorker
from transformers import AutoConfig, AutoModelForSequenceClassification

from roll_lite.config import RewardConfig
from roll_lite.model.tokenizer import build_char_tokenizer
from roll_lite.rewards.checks import check_reward_models
from roll_lite.rewards.reward_model import RewardModel, check_reward_model_folder, model_metric_name

TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"


def save_reward_model(folder, num_labels=1, chat_template=None, positions=64, causal=False):
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = chat_template
    config = AutoConfig.for_model(
        "qwen2",
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=positions,
        num_labels=num_labels,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    if causal:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_config(config)
    else:
        model = AutoModelForSequenceClassification.from_config(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def alone(model: RewardModel, ids: list[int]) -> float:
    """The model's score of one sequence, unbatched and unpadded."""
    with torch.no_grad():
        return model.model(input_ids=torch.tensor([ids])).logits[0, 0].item()


def test_a_bad_folder_is_named_with_its_key(tmp_path):
    with pytest.raises(ValueError, match=r"reward.models.x: no such folder"):
        check_reward_model_folder(str(tmp_path / "missing"), "reward.models.x")
    two = save_reward_model(tmp_path / "two", num_labels=2)
    with pytest.raises(ValueError, match="has a head of 2 labels; a reward model gives one score per sequence"):
        check_reward_model_folder(two, "reward.models.two")
    lm = save_reward_model(tmp_path / "lm", causal=True)
    with pytest.raises(ValueError, match="is a Qwen2ForCausalLM model, not a sequence-classification one"):
        check_reward_model_folder(lm, "reward.models.lm")
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    first, second = save_reward_model(tmp_path / "a" / "rm"), save_reward_model(tmp_path / "b" / "rm")
    with pytest.raises(ValueError, match="share the metric name 'model:rm'"):
        check_reward_models({first: 1.0, second: 1.0})
    # a run's final/ is named by its run: two runs' models are told apart
    runs = [save_reward_model(tmp_path / run / "final") for run in ("rm_one", "rm_two")]
    assert [model_metric_name(path) for path in runs] == ["model:rm_one", "model:rm_two"]
    check_reward_models({path: 1.0 for path in runs})


def test_with_the_policys_tokenizer_the_ids_go_straight_in_and_batches_change_nothing(tmp_path):
    policy = build_char_tokenizer()
    model = RewardModel(save_reward_model(tmp_path / "rm"), policy, max_tokens=40)
    assert model.same_tokenizer and "the policy's token ids go straight in" in model.describe()
    sequences = [policy("12+3=")["input_ids"] + policy(response)["input_ids"] for response in ("15", "7", "1234", "")]
    outcomes = model.score(["12+3="] * 4, ["15", "7", "1234", ""], sequences)
    assert all(o.ok for o in outcomes)
    # length-sorted, padded batches of <= 40 tokens: each score is the sequence's own
    assert [o.value for o in outcomes] == pytest.approx([alone(model, ids) for ids in sequences], abs=1e-5)


def test_another_chat_template_re_renders_the_conversation(tmp_path):
    policy = build_char_tokenizer()
    model = RewardModel(save_reward_model(tmp_path / "rm", chat_template=TEMPLATE), policy)
    assert not model.same_tokenizer and "rendered with its own chat template" in model.describe()
    parts = [{"type": "image"}, {"type": "text", "text": "how many?"}]  # an image row's content, read as text
    prompts = ["2+2=", [{"role": "system", "content": "add"}, {"role": "user", "content": "1+1="}]]
    prompts.append([{"role": "user", "content": parts}])
    outcomes = model.score(
        prompts, ["4", "2", "3"], sequences=[[9, 9, 9], [9, 9], [9]]
    )  # the policy's ids are not used
    # the template renders every token (as HF's apply_chat_template: no special tokens added)
    rendered = [
        model.tokenizer("<user>2+2=<assistant>4", add_special_tokens=False)["input_ids"],
        model.tokenizer("<system>add<user>1+1=<assistant>2", add_special_tokens=False)["input_ids"],
        model.tokenizer("<user><image>how many?<assistant>3", add_special_tokens=False)["input_ids"],
    ]
    assert [o.value for o in outcomes] == pytest.approx([alone(model, ids) for ids in rendered], abs=1e-5)


def test_what_breaks_costs_its_rows_only_and_normalize_and_clip_apply_to_the_rest(tmp_path, monkeypatch):
    policy = build_char_tokenizer()
    model = RewardModel(save_reward_model(tmp_path / "rm", positions=8), policy, max_tokens=8)
    sequences = [[5] * 3, [6] * 20, [7] * 4, [8] * 2]
    outcomes = model.score(["p"] * 4, ["r"] * 4, sequences)
    assert [o.kind for o in outcomes] == ["ok", "failed", "ok", "ok"]
    assert outcomes[1].reason == "20 tokens, more than the reward model's 8 positions"

    forward = model._forward

    def flaky(batch):  # the batch holding the 4-token row breaks
        if any(len(ids) == 4 for ids in batch):
            raise RuntimeError("out of memory")
        return forward(batch)

    monkeypatch.setattr(model, "_forward", flaky)
    broken = model.score(["p"] * 4, ["r"] * 4, sequences)
    assert broken[2].kind == "failed" and broken[2].reason == "reward model forward: RuntimeError: out of memory"
    assert broken[0].ok and broken[3].ok

    monkeypatch.setattr(model, "_forward", forward)
    model.normalize, model.clip = True, 0.5
    standardised = model.score(["p"] * 4, ["r"] * 4, [[5] * 3, [6] * 5, [7] * 4, [8] * 2])
    values = torch.tensor([o.value for o in standardised])
    assert values.abs().max() <= 0.5 and len(set(values.tolist())) > 1


def test_batches_not_started_within_the_timeout_are_timed_out_and_the_rest_scored(tmp_path, monkeypatch):
    import time

    policy = build_char_tokenizer()
    model = RewardModel(save_reward_model(tmp_path / "rm"), policy, max_tokens=8, timeout_s=0.05)
    assert model.describe().endswith(", batches after 0.05 s timed out")
    forward = model._forward

    def slow(batch):  # each batch takes longer than the whole limit
        time.sleep(0.1)
        return forward(batch)

    monkeypatch.setattr(model, "_forward", slow)
    sequences = [[5] * 6, [6] * 2, [7] * 7, [8] * 3]  # 8 tokens a batch: [2, 3], [6], [7] in length order
    outcomes = model.score(["p"] * 4, ["r"] * 4, sequences)
    assert [o.kind for o in outcomes] == ["timed_out", "ok", "timed_out", "ok"]  # the first batch ran
    assert outcomes[0].reason == f"reward model {tmp_path / 'rm'}: not reached within reward.model_timeout_s=0.05 s"


def test_the_worker_adds_a_reward_model_to_the_functions(tmp_path):
    policy = build_char_tokenizer()
    folder = save_reward_model(tmp_path / "judge_rm")
    worker = RewardWorker(RewardConfig(functions={"exact_answer": 1.0}, models={folder: 0.5}))
    assert worker.describe() == [
        f"reward model {folder}: the policy's token ids go straight in (same tokenizer and chat template)",
        "reward models and judges on cpu",
    ]
    sequences = [policy("1=" + r)["input_ids"] for r in ("1", "2")]
    scores, scored, metrics = worker.score(["1", "2"], ["1", "1"], None, ["1=", "1="], sequences)
    rm = [alone(worker.models[folder], ids) for ids in sequences]
    assert scores.tolist() == pytest.approx([1.0 + 0.5 * rm[0], 0.5 * rm[1]], abs=1e-5)
    assert scored.tolist() == [True, True] and metrics["reward/model:judge_rm"] == pytest.approx(sum(rm) / 2, abs=1e-5)
    with pytest.raises(ValueError, match="the reward models and judges need each row's prompt and token ids"):
        worker.score(["1"], ["1"])


def test_a_reward_model_without_a_pad_token_is_refused_before_the_run(tmp_path):
    folder = save_reward_model(tmp_path / "rm")
    tokenizer = build_char_tokenizer()
    tokenizer.pad_token = None
    tokenizer.save_pretrained(folder)
    with pytest.raises(ValueError, match="reward.models.rm: the tokenizer of .* has no pad token"):
        check_reward_model_folder(folder, "reward.models.rm")
