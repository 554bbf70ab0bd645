"""Token in, token out (roll_lite/environments/turns.py): a multi-turn trajectory is the engine's
sampled ids and the ids each chat-templated observation adds, never re-tokenized text; its model_mask
marks exactly the sampled tokens and its log-probs are exactly the engine's."""

import pytest
import torch

from roll_lite.environments.turns import TemplateError, Trajectory, observation_ids, trajectory_batch
from roll_lite.model.tokenizer import build_char_tokenizer

# Qwen's shape with the character tokenizer's specials: <bos> opens a turn, <eos> (the EOS) ends it,
# and a newline follows the end of every turn
TEMPLATE = (
    "{% for m in messages %}<bos>{{ m['role'] }}\n{{ m['content'] }}<eos>\n{% endfor %}"
    "{% if add_generation_prompt %}<bos>assistant\n{% endif %}"
)


@pytest.fixture
def tokenizer():
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def text_ids(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def test_an_observation_adds_the_turn_separator_its_message_and_the_generation_prompt(tokenizer):
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    expected = (
        text_ids(tokenizer, "\n")
        + [bos]
        + text_ids(tokenizer, "user\nhigher")
        + [eos]
        + text_ids(tokenizer, "\n")
        + [bos]
        + text_ids(tokenizer, "assistant\n")
    )
    assert observation_ids(tokenizer, "higher") == expected  # the "\n" after the model's <eos> is not dropped
    tool = observation_ids(tokenizer, [{"role": "tool", "content": "42"}])
    assert tokenizer.decode(tool) == "\n<bos>tool\n42<eos>\n<bos>assistant\n"


def test_a_trajectory_is_the_template_of_the_whole_conversation_when_the_samples_are_canonical(tokenizer):
    eos = tokenizer.eos_token_id
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "guess"}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    trajectory = Trajectory(list(prompt))
    for guess, feedback in (("12", "higher"), ("15", None)):
        sampled = text_ids(tokenizer, guess) + [eos]
        trajectory.add_model_turn(sampled, [-0.5] * len(sampled))
        if feedback:
            trajectory.add_observation(observation_ids(tokenizer, feedback))
    whole = tokenizer.apply_chat_template(
        [
            {"role": "user", "content": "guess"},
            {"role": "assistant", "content": "12"},
            {"role": "user", "content": "higher"},
            {"role": "assistant", "content": "15"},
        ],
        tokenize=True,
        return_dict=False,
    )
    ids = trajectory.prompt_ids + trajectory.response_ids
    assert ids == list(whole)[: len(ids)] and len(whole) == len(ids) + 1  # the template's closing "\n" is not sampled
    assert trajectory.num_model_turns == 2


def test_the_sampled_ids_and_log_probs_are_kept_exactly_and_only_they_are_the_models():
    trajectory = Trajectory([1, 5])
    trajectory.add_model_turn([9, 9, 40], [-0.1, -0.2, -0.3])  # ids as sampled, whatever text they decode to
    trajectory.add_observation([7, 8])
    trajectory.add_model_turn([2], [-0.4])
    other = Trajectory([1])
    tensors = trajectory_batch([trajectory, other], pad_token_id=0)
    assert tensors["input_ids"].tolist() == [[1, 5, 9, 9, 40, 7, 8, 2], [1, 0, 0, 0, 0, 0, 0, 0]]
    assert tensors["attention_mask"].tolist() == [[1] * 8, [1] + [0] * 7]
    assert tensors["response_mask"].tolist() == [[0, 0, 1, 1, 1, 1, 1, 1], [0] * 8]
    assert tensors["model_mask"].tolist() == [[0, 0, 1, 1, 1, 0, 0, 1], [0] * 8]
    model = tensors["model_mask"].bool()
    assert tensors["input_ids"][model].tolist() == [9, 9, 40, 2]
    assert tensors["rollout_log_probs"][model].tolist() == pytest.approx([-0.1, -0.2, -0.3, -0.4])
    assert torch.all(tensors["rollout_log_probs"][~model] == 0)
    with pytest.raises(ValueError, match="a model turn of 2 tokens came with 1 log-probs"):
        trajectory.add_model_turn([3, 4], [-1.0])


def test_templates_that_cannot_be_continued_token_by_token_are_named(tokenizer):
    tokenizer.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    with pytest.raises(TemplateError, match="does not end an assistant turn with the end-of-turn token"):
        observation_ids(tokenizer, "higher")
    # a template that rewrites earlier assistant turns once another message follows (as those that strip <think>)
    tokenizer.chat_template = (
        "{% for m in messages %}<bos>{{ m['role'] }}\n{% if m['role'] == 'assistant' and not loop.last %}"
        "[old]{% endif %}{{ m['content'] }}<eos>\n{% endfor %}"
        "{% if add_generation_prompt %}<bos>assistant\n{% endif %}"
    )
    with pytest.raises(TemplateError, match="renders earlier turns differently"):
        observation_ids(tokenizer, "higher")
