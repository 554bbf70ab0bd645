import random

import pytest

from roll_lite.rewards import extract_final_answer, get_reward
from roll_lite.tasks import ReverseDigitsTask, noisy_demonstration
from roll_lite.tokenizer import build_char_tokenizer


def test_exact_answer_and_token_accuracy():
    exact, accuracy = get_reward("exact_answer"), get_reward("token_accuracy")
    assert exact(" 321 ", "321") == 1.0 and exact("3210", "321") == 0.0
    assert accuracy("324", "321") == pytest.approx(2 / 3)
    assert accuracy("3210", "321") == pytest.approx(3 / 4)
    assert accuracy("", "321") == 0.0


@pytest.mark.parametrize(
    "text, expected",
    [("so the answer is 42.", "42"), ("x = 3, y = 4 #### 7", "7"), ("\\boxed{1/2} and 9", "1/2"), ("no number", None),
     ("The total is 1,234 apples", "1,234")],
)
def test_extract_final_answer(text, expected):
    assert extract_final_answer(text) == expected


def test_math_answer_compares_numbers():
    math_answer = get_reward("math_answer")
    assert math_answer("... #### 1,234", "1234") == 1.0
    assert math_answer("\\boxed{0.5}", "1/2") == 1.0
    assert math_answer("answer: 3.0001", "3") == 0.0
    assert math_answer("nothing", "3") == 0.0


def test_format_rewards():
    assert get_reward("format")("think first <answer>12</answer>", "12") == 1.0
    assert get_reward("format")("<answer>1</answer><answer>2</answer>", "2") == 0.0
    assert get_reward("digits_only")("0123", "x") == 1.0 and get_reward("digits_only")("12a", "x") == 0.0
    with pytest.raises(KeyError, match="registered: .*exact_answer"):
        get_reward("nope")


def test_task_holds_out_eval_prompts_and_demonstrator_mixes_behaviours():
    task = ReverseDigitsTask(min_digits=3, max_digits=3, num_eval=200, seed=1)
    eval_prompts = {e.prompt for e in task.eval_examples}
    assert len(eval_prompts) == 200
    train = task.train_examples(2000)
    assert not eval_prompts & {e.prompt for e in train}
    assert all(e.answer == e.prompt[:-1][::-1] for e in train)
    rng = random.Random(0)
    targets = [noisy_demonstration(e, 0.3, rng) for e in train[:1000]]
    correct = sum(t == e.answer for t, e in zip(targets, train)) / 1000
    assert 0.25 < correct < 0.40  # palindromes count as correct under both behaviours


def test_char_tokenizer_roundtrip(tmp_path):
    from transformers import PreTrainedTokenizerFast

    tokenizer = build_char_tokenizer()
    ids = tokenizer("93 = x")["input_ids"]  # <bos> first: add_bos_token
    assert len(ids) == 7 and ids[0] == tokenizer.bos_token_id and tokenizer.decode(ids[1:]) == "93 = x"
    assert tokenizer("93 = x", add_special_tokens=False)["input_ids"] == ids[1:]
    tokenizer.save_pretrained(tmp_path)
    assert PreTrainedTokenizerFast.from_pretrained(tmp_path)("93")["input_ids"] == ids[:3]


def test_load_tokenizer_from_a_folder_and_errors(tmp_path):
    from roll_lite.tokenizer import load_tokenizer

    build_char_tokenizer().save_pretrained(tmp_path / "tok")
    assert load_tokenizer(str(tmp_path / "tok"))("42")["input_ids"] == build_char_tokenizer()("42")["input_ids"]
    with pytest.raises(ValueError, match="model.tokenizer_path: no such folder .*missing' \\(and not a hub id"):
        load_tokenizer(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="model.tokenizer_path: '.*' has no tokenizer.json"):
        load_tokenizer(str(tmp_path))
