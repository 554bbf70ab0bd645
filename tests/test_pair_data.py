"""Preference pairs (roll_lite/data/pairs.py): what each side's loss is on, the batch layout the pair
losses read, one-line errors naming the file, row and key; and pairs kept together on one rank and in
one micro-batch whatever D, A and packing (roll_lite/strategy/micro_batches.py)."""

import json

import pytest
import torch

from roll_lite.config import PreferenceConfig
from roll_lite.data import DataError
from roll_lite.data.digit_pairs import digit_pair_rows
from roll_lite.data.pairs import build_pair_batch, prepare_pair_datasets, score_positions
from roll_lite.model.tokenizer import build_char_tokenizer
from roll_lite.strategy.config import StrategyConfig
from roll_lite.strategy.micro_batches import data_parallel_groups, micro_batch_groups

TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}<end>\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def write_pairs(tmp_path, rows, fmt="jsonl"):
    """The rows as JSONL, Parquet or a `save_to_disk` folder: the formats the shared reader (roll_lite/data/files.py) takes."""
    if fmt == "jsonl":
        return write_jsonl(tmp_path / "pairs.jsonl", rows)
    import datasets

    table = datasets.Dataset.from_list(rows)
    if fmt == "parquet":
        table.to_parquet(str(tmp_path / "pairs.parquet"))
        return str(tmp_path / "pairs.parquet")
    table.save_to_disk(str(tmp_path / "saved"))
    return str(tmp_path / "saved")


def load(tmp_path, rows, tokenizer=None, fmt="jsonl", **settings):
    path = write_pairs(tmp_path, rows, fmt)
    return prepare_pair_datasets(PreferenceConfig(train_files=[path], **settings), tokenizer or build_char_tokenizer())


def targets(tokenizer, side):
    ids, mask = side
    return tokenizer.decode([t for t, m in zip(ids, mask) if m])


def test_string_pairs_train_on_each_response_and_eos(tmp_path):
    tokenizer = build_char_tokenizer()
    data = load(tmp_path, [{"prompt": "12=", "chosen": "21", "rejected": "12"}]).train
    (chosen,), (rejected,) = data.chosen, data.rejected
    assert chosen[0] == [tokenizer.bos_token_id] + tokenizer("12=21", add_special_tokens=False)["input_ids"] + [
        tokenizer.eos_token_id
    ]
    assert targets(tokenizer, chosen) == "21<eos>" and targets(tokenizer, rejected) == "12<eos>"


def test_chat_pairs_train_on_the_response_turn_only(tmp_path):
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = TEMPLATE
    prompt = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "2+2"},
    ]
    row = {
        "prompt": prompt,
        "chosen": [{"role": "assistant", "content": "4"}],
        "rejected": [{"role": "assistant", "content": "5"}],
    }
    data = load(tmp_path, [row], tokenizer).train
    assert targets(tokenizer, data.chosen[0]) == "4<end>\n"  # not the prompt's own assistant turn "yo"
    assert targets(tokenizer, data.rejected[0]) == "5<end>\n"


@pytest.mark.parametrize(
    "row, settings, message",
    [
        ({"chosen": "1", "rejected": "2"}, {}, "key 'prompt' (preference.prompt_key) is missing or null"),
        ({"prompt": "1=", "rejected": "2"}, {}, "key 'chosen' (preference.chosen_key) is missing or null"),
        (
            {"prompt": "1=", "chosen": "1", "rejected": None},
            {},
            "key 'rejected' (preference.rejected_key) is missing or null",
        ),
        ({"prompt": "1=", "chosen": "  ", "rejected": "2"}, {}, "key 'chosen': the chosen response is empty"),
        ({"prompt": "", "chosen": "1", "rejected": "2"}, {}, "key 'prompt': the prompt is empty"),
        ({"prompt": "1=", "chosen": "1", "rejected": "1"}, {}, "the chosen and the rejected response are the same"),
        (
            {"prompt": "1=", "chosen": [{"role": "user", "content": "1"}], "rejected": "2"},
            {},
            "the chosen messages must end with a non-empty assistant message",
        ),
        (
            {"prompt": "1=", "chosen": "1", "rejected": "2", "m": "big"},
            {"margin_key": "m"},
            "the margin must be a number",
        ),
        (
            {"prompt": [{"role": "user", "content": "1"}], "chosen": "1", "rejected": "2"},
            {},
            "need the tokenizer's chat template",
        ),
    ],
)
def test_bad_rows_are_one_line_errors_naming_file_row_and_key(tmp_path, row, settings, message):
    good = {"prompt": "9=", "chosen": "9", "rejected": "8", "m": 1.0}
    if isinstance(row.get("chosen"), list):  # the datasets reader turns a column of strings and lists into neither
        good["chosen"] = [{"role": "assistant", "content": "9"}]
    tokenizer = build_char_tokenizer()
    if "chat template" not in message:
        tokenizer.chat_template = TEMPLATE
    with pytest.raises(DataError) as error:
        load(tmp_path, [good, row], tokenizer, **settings)
    assert "pairs.jsonl: row 1 (line 2): " in str(error.value) and message in str(error.value)
    assert "\n" not in str(error.value)


CHAT_PAIRS = [
    {
        "prompt": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yo"},
            {"role": "user", "content": "2+2"},
        ],
        "chosen": [{"role": "assistant", "content": "4"}],
        "rejected": [{"role": "assistant", "content": "5"}],
        "m": 1.5,
    },
    {
        "prompt": [{"role": "user", "content": "12="}],
        "chosen": [{"role": "assistant", "content": "21"}],
        "rejected": [{"role": "assistant", "content": "12"}],
        "m": 0.0,
    },
]
STRING_PAIRS = [
    {"prompt": "12=", "chosen": "21", "rejected": "1", "m": 0.5},
    {"prompt": "345=", "chosen": "543", "rejected": "54", "m": 2},
]


@pytest.mark.parametrize("fmt", ["parquet", "saved"])
@pytest.mark.parametrize("rows", [STRING_PAIRS, CHAT_PAIRS], ids=["strings", "chat"])
def test_parquet_and_saved_pairs_give_the_jsonl_pairs_and_batch(tmp_path, fmt, rows):
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = TEMPLATE
    (tmp_path / "jsonl").mkdir()
    (tmp_path / fmt).mkdir()
    expected = load(tmp_path / "jsonl", rows, tokenizer, margin_key="m").train
    got = load(tmp_path / fmt, rows, tokenizer, fmt=fmt, margin_key="m").train
    assert (got.chosen, got.rejected, got.margins) == (expected.chosen, expected.rejected, expected.margins)
    batches = [build_pair_batch(data, tokenizer.pad_token_id) for data in (expected, got)]
    assert batches[0].batch.keys() == batches[1].batch.keys()
    assert all(torch.equal(batches[0][key], batches[1][key]) for key in batches[0].batch.keys())
    assert batches[0].meta_info == batches[1].meta_info


@pytest.mark.parametrize("fmt", ["parquet", "saved"])
@pytest.mark.parametrize(
    "bad, message",
    [
        ({"chosen": "21", "rejected": "21"}, "the chosen and the rejected response are the same"),
        ({"chosen": "21", "rejected": " "}, "key 'rejected': the rejected response is empty"),
    ],
    ids=["identical", "empty"],
)
def test_a_bad_row_in_parquet_or_saved_pairs_is_one_line_naming_file_and_row(tmp_path, fmt, bad, message):
    rows = [STRING_PAIRS[0], {**STRING_PAIRS[1], **bad}]
    with pytest.raises(DataError) as error:
        load(tmp_path, rows, fmt=fmt)
    path = str(tmp_path / ("pairs.parquet" if fmt == "parquet" else "saved"))
    assert str(error.value).startswith(f"preference.train_files: {path}: row 1: ") and message in str(error.value)
    assert "\n" not in str(error.value)


def test_long_pairs_are_left_out_and_counted(tmp_path):
    rows = [{"prompt": "1=", "chosen": "1", "rejected": "2"}, {"prompt": "1=", "chosen": "1", "rejected": "2222222222"}]
    prepared = load(tmp_path, rows, max_length=8)
    assert len(prepared.train) == 1
    assert any("1 of 2 pairs are longer than preference.max_length=8" in note for note in prepared.notes)


def test_batch_layout_pairs_in_consecutive_rows_with_their_masks_and_margins(tmp_path):
    tokenizer = build_char_tokenizer()
    rows = [
        {"prompt": "12=", "chosen": "21", "rejected": "1", "m": 0.5},
        {"prompt": "3=", "chosen": "3", "rejected": "33", "m": 2},
    ]
    data = load(tmp_path, rows, margin_key="m").train
    batch = build_pair_batch(data, tokenizer.pad_token_id)
    # every mask a pair loss reads is declared, so the strategy counts it and the loss checker knows it
    assert batch.meta_info == {"loss_mask_keys": ["chosen_mask", "rejected_mask", "score_mask"], "rows_together": 2}
    assert batch["chosen_mask"].any(-1).tolist() == [True, False, True, False]
    assert batch["rejected_mask"].any(-1).tolist() == [False, True, False, True]
    assert batch["margin"].tolist() == [0.5, 0.5, 2.0, 2.0]
    last = batch["attention_mask"].sum(-1) - 1  # <eos> ends every row, and it is not the pad token
    assert torch.equal(batch["score_mask"].argmax(-1), last) and batch["score_mask"].sum().item() == 4


def test_score_positions_skip_trailing_pad_ids_as_transformers_does():
    # A tokenizer whose pad is its eos: the sequence classifier reads the last token that is not the pad id.
    input_ids = torch.tensor([[5, 6, 2, 2], [5, 2, 7, 2]])
    attention = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    assert score_positions(input_ids, attention, pad_token_id=2).argmax(-1).tolist() == [1, 2]
    with pytest.raises(ValueError, match="only pad tokens"):
        score_positions(torch.tensor([[2, 2]]), torch.tensor([[1, 1]]), pad_token_id=2)


def test_shipped_digit_pairs_are_the_generator_output():
    from pathlib import Path

    train, evaluation = digit_pair_rows()
    folder = Path(__file__).resolve().parents[1] / "data/reverse_digits_pairs"
    for rows, name in ((train, "train.jsonl"), (evaluation, "eval.jsonl")):
        assert (folder / name).read_text().splitlines() == [json.dumps(r, separators=(",", ":")) for r in rows]
    assert all(r["chosen"] != r["rejected"] for r in train + evaluation)
    assert {r["prompt"] for r in train}.isdisjoint({r["prompt"] for r in evaluation})


@pytest.mark.parametrize(
    "config",
    [
        StrategyConfig(grad_accum_steps=3, use_packing=False, trim_padding=False),
        StrategyConfig(grad_accum_steps=3, use_packing=False, trim_padding=True),
        StrategyConfig(grad_accum_steps=3, use_packing=True),
        StrategyConfig(use_packing=True, max_tokens_per_micro_batch=24),
    ],
    ids=["padded", "trimmed", "packed", "budget"],
)
@pytest.mark.parametrize("balance", [False, True], ids=["contiguous", "balanced"])
def test_pairs_stay_together_on_a_rank_and_in_a_micro_batch(tmp_path, config, balance):
    rows = [
        {"prompt": f"{i}" * (1 + i % 4) + "=", "chosen": "1" * (1 + i % 3), "rejected": "2" * (1 + (i * 7) % 5)}
        for i in range(9)
    ]
    batch = build_pair_batch(load(tmp_path, rows).train, 0)
    seen = []
    for share in data_parallel_groups(batch, 2, balance_tokens=balance):
        part = batch.index_select(share)
        for group in micro_batch_groups(part, config):
            rows_here = [share[i] for i in group]
            assert all(row % 2 == 0 and row + 1 in rows_here for row in rows_here[::2]), rows_here
            assert [r % 2 for r in rows_here] == [0, 1] * (len(rows_here) // 2)  # chosen, then its rejected
            seen += rows_here
    assert sorted(seen) == list(range(18))


def test_a_pair_over_the_token_budget_is_named():
    batch = build_pair_batch(load_one_pair(), 0)
    with pytest.raises(
        ValueError, match=r"rows 0-1, kept together .* have 6 tokens, more than max_tokens_per_micro_batch=5"
    ):
        micro_batch_groups(batch, StrategyConfig(use_packing=True, max_tokens_per_micro_batch=5))


def test_rows_together_must_divide_the_batch():
    batch = build_pair_batch(load_one_pair(), 0).slice(0, 1)
    with pytest.raises(ValueError, match="not whole blocks"):
        data_parallel_groups(batch, 2, balance_tokens=False)


def load_one_pair():
    from roll_lite.data.pairs import PairData

    return PairData([([1, 5, 2], [0, 1, 1])], [([1, 6, 2], [0, 1, 1])])
