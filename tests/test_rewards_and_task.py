import random

import pytest

from roll_lite.tasks import ReverseDigitsTask, noisy_demonstration
from roll_lite.tokenizer import build_char_tokenizer


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
