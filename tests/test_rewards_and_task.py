import json
import random
from pathlib import Path

import pytest

from roll_lite.data.digits import noisy_demonstration, reverse_digits_rows, write_reverse_digits
from roll_lite.model.tokenizer import build_char_tokenizer

REPO = Path(__file__).resolve().parents[1]


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
    train = [json.loads(line) for line in (REPO / "data/reverse_digits/train.jsonl").read_text().splitlines()]
    assert all(row["demonstration"] in (row["answer"], row["prompt"][:-1]) for row in train)  # the warm start's targets
    assert 0.28 < sum(row["demonstration"] == row["answer"] for row in train) / len(train) < 0.36
    assert len((REPO / "data/reverse_digits/train.jsonl").read_text().splitlines()) == 20000


def test_char_tokenizer_roundtrip(tmp_path):
    from transformers import PreTrainedTokenizerFast

    tokenizer = build_char_tokenizer()
    ids = tokenizer("93 = x")["input_ids"]  # <bos> first: add_bos_token
    assert len(ids) == 7 and ids[0] == tokenizer.bos_token_id and tokenizer.decode(ids[1:]) == "93 = x"
    assert tokenizer("93 = x", add_special_tokens=False)["input_ids"] == ids[1:]
    tokenizer.save_pretrained(tmp_path)
    assert PreTrainedTokenizerFast.from_pretrained(tmp_path)("93")["input_ids"] == ids[:3]


def test_load_tokenizer_from_a_folder_and_errors(tmp_path):
    from roll_lite.model.tokenizer import load_tokenizer

    build_char_tokenizer().save_pretrained(tmp_path / "tok")
    assert load_tokenizer(str(tmp_path / "tok"))("42")["input_ids"] == build_char_tokenizer()("42")["input_ids"]
    with pytest.raises(ValueError, match="model.tokenizer_path: no such folder .*missing' \\(and not a hub id"):
        load_tokenizer(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="model.tokenizer_path: '.*' has no tokenizer.json"):
        load_tokenizer(str(tmp_path))
