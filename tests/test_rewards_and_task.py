import json
import random
from pathlib import Path

import pytest

from roll_lite.rewards import extract_final_answer, get_reward
from roll_lite.data.digits import noisy_demonstration, reverse_digits_rows, write_reverse_digits
from roll_lite.tokenizer import build_char_tokenizer

REPO = Path(__file__).resolve().parents[1]


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


def test_digit_data_holds_out_eval_prompts_and_demonstrator_mixes_behaviours():
    train, evaluation = reverse_digits_rows(num_train=2000, num_eval=200, min_digits=3, max_digits=3, seed=1)
    eval_prompts = {row["prompt"] for row in evaluation}
    assert len(eval_prompts) == 200
    assert not eval_prompts & {row["prompt"] for row in train}
    assert all(row["answer"] == row["prompt"][:-1][::-1] and len(row["answer"]) == 3 for row in train)
    rng = random.Random(0)
    targets = [noisy_demonstration(row["prompt"], row["answer"], 0.3, rng) for row in train[:1000]]
    correct = sum(t == row["answer"] for t, row in zip(targets, train)) / 1000
    copies = sum(t == row["prompt"][:-1] for t, row in zip(targets, train)) / 1000
    assert 0.25 < correct < 0.40  # palindromes count as correct under both behaviours
    assert 0.65 < copies < 0.80 and all(t in (row["answer"], row["prompt"][:-1]) for t, row in zip(targets, train))


def test_the_shipped_digit_files_are_the_generators_output(tmp_path):
    write_reverse_digits(tmp_path)
    for name in ("train.jsonl", "eval.jsonl"):
        assert (tmp_path / name).read_bytes() == (REPO / "data/reverse_digits" / name).read_bytes(), name
    lines = (REPO / "data/reverse_digits/eval.jsonl").read_text().splitlines()
    assert len(lines) == 64 and json.loads(lines[0]).keys() == {"prompt", "answer"}
    assert len((REPO / "data/reverse_digits/train.jsonl").read_text().splitlines()) == 20000


def test_char_tokenizer_roundtrip(tmp_path):
    from transformers import PreTrainedTokenizerFast

    tokenizer = build_char_tokenizer()
    ids = tokenizer("93 = x")["input_ids"]
    assert len(ids) == 6 and tokenizer.decode(ids) == "93 = x"
    tokenizer.save_pretrained(tmp_path)
    assert PreTrainedTokenizerFast.from_pretrained(tmp_path)("93")["input_ids"] == ids[:2]


def test_load_tokenizer_from_a_folder_and_errors(tmp_path):
    from roll_lite.tokenizer import load_tokenizer

    build_char_tokenizer().save_pretrained(tmp_path / "tok")
    assert load_tokenizer(str(tmp_path / "tok"))("42")["input_ids"] == build_char_tokenizer()("42")["input_ids"]
    with pytest.raises(ValueError, match="model.tokenizer_path: cannot load a tokenizer from"):
        load_tokenizer(str(tmp_path / "missing"))
