"""Prompt datasets (roll_lite/data/): every format, chat templates, extra fields, length filtering.

Expected token ids are worked out from the character tokenizer's vocabulary, one id per character.
"""

import json
import logging

import pytest

from roll_lite.config import DataConfig, load_config
from roll_lite.data import DataError
from roll_lite.data.prompts import prepare_datasets
from roll_lite.model.tokenizer import build_char_tokenizer

ROWS = [
    {"prompt": "12=", "answer": "21", "level": 1, "tests": ["a", "b"]},
    {"prompt": "345=", "answer": "543", "level": 2, "tests": ["c"]},
    {"prompt": "6=", "answer": "6", "level": 3, "tests": []},
]
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def char_ids(tokenizer, text):
    # The character tokenizer's symbols are byte-level: space is 'Ġ', newline 'Ċ'.
    from roll_lite.model.tokenizer import _byte_level

    return tokenizer.convert_tokens_to_ids([_byte_level(c) for c in text])


def write_jsonl(path, rows, blank_line_after=None):
    lines = [json.dumps(row) for row in rows]
    if blank_line_after is not None:
        lines.insert(blank_line_after + 1, "")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write(fmt, tmp_path, rows):
    import datasets

    if fmt == "jsonl":
        return write_jsonl(tmp_path / "rows.jsonl", rows, blank_line_after=0)
    if fmt == "json":  # one JSON array
        (tmp_path / "rows.json").write_text(json.dumps(rows))
        return tmp_path / "rows.json"
    table = datasets.Dataset.from_list(rows)
    if fmt == "parquet":
        table.to_parquet(str(tmp_path / "rows.parquet"))
        return tmp_path / "rows.parquet"
    table.save_to_disk(str(tmp_path / "saved"))
    return tmp_path / "saved"


def data_config(train, **options):
    return DataConfig(train_files=[str(p) for p in (train if isinstance(train, list) else [train])], **options)


@pytest.mark.parametrize("fmt", ["jsonl", "json", "parquet", "saved"])
def test_every_format_gives_the_same_prompts_answers_and_extras(tmp_path, fmt):
    tokenizer = build_char_tokenizer()
    prepared = prepare_datasets(data_config(write(fmt, tmp_path, ROWS)), tokenizer)
    train = prepared.train
    bos = tokenizer.bos_token_id
    assert train.prompt_ids == [
        [bos] + char_ids(tokenizer, "12="),
        [bos] + char_ids(tokenizer, "345="),
        [bos] + char_ids(tokenizer, "6="),
    ]
    assert train.answers == ["21", "543", "6"]
    assert train.extras == [{"level": 1, "tests": ["a", "b"]}, {"level": 2, "tests": ["c"]}, {"level": 3, "tests": []}]
    assert prepared.eval is None


def test_files_concatenate_in_order_and_extra_keys_select_fields(tmp_path):
    tokenizer = build_char_tokenizer()
    first = write_jsonl(tmp_path / "a.jsonl", ROWS[:2])
    second = write_jsonl(tmp_path / "b.jsonl", ROWS[2:])
    prepared = prepare_datasets(data_config([first, second], extra_keys=["level"], eval_files=[str(second)]), tokenizer)
    assert prepared.train.answers == ["21", "543", "6"] and prepared.eval.answers == ["6"]
    assert prepared.train.extras == [{"level": 1}, {"level": 2}, {"level": 3}]
    assert prepared.notes == [
        f"data.train_files: {first}: 2 prompts",
        f"data.train_files: {second}: 1 prompts",
        f"data.eval_files: {second}: 1 prompts",
    ]


def test_numeric_answers_become_strings_and_mixed_types_are_named(tmp_path):
    path = write_jsonl(tmp_path / "numbers.jsonl", [{"prompt": "1+1=", "answer": 2}, {"prompt": "1/2=", "answer": 0.5}])
    assert prepare_datasets(data_config(path), build_char_tokenizer()).train.answers == ["2", "0.5"]
    path = write_jsonl(tmp_path / "mixed.jsonl", ROWS[:1] + [{"prompt": "3=", "answer": 3}], blank_line_after=0)
    with pytest.raises(
        DataError,
        match=r"^data.train_files: .*mixed.jsonl: line 3 \(row 1\): key 'answer' is a number "
        r"where row 0 has a string; a column needs one type in every row$",
    ):
        prepare_datasets(data_config(path), build_char_tokenizer())


def test_chat_messages_use_the_tokenizers_template(tmp_path):
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    rows = [
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "12="}], "answer": "21"},
        {"messages": "34=", "answer": "43"},
    ]  # a string prompt goes through the template when asked
    path = write_jsonl(tmp_path / "chat.jsonl", [rows[0]])
    prepared = prepare_datasets(data_config(path, prompt_key="messages"), tokenizer)
    assert prepared.train.prompt_ids == [char_ids(tokenizer, "<system>be brief\n<user>12=\n<assistant>")]  # no BOS
    assert prepared.train.prompts == [rows[0]["messages"]]
    path = write_jsonl(tmp_path / "strings.jsonl", [rows[1]])
    prepared = prepare_datasets(data_config(path, prompt_key="messages", apply_chat_template=True), tokenizer)
    assert prepared.train.prompt_ids == [char_ids(tokenizer, "<user>34=\n<assistant>")]


def test_chat_prompts_without_a_template_name_the_row_and_key(tmp_path):
    tokenizer = build_char_tokenizer()
    assert not tokenizer.chat_template
    path = write_jsonl(tmp_path / "chat.jsonl", [{"messages": [{"role": "user", "content": "1="}], "answer": "1"}])
    with pytest.raises(DataError) as error:
        prepare_datasets(data_config(path, prompt_key="messages"), tokenizer)
    assert str(error.value).startswith(
        f"data.train_files: {path}: row 0 (line 1): key 'messages': chat messages need "
        "the tokenizer's chat template and the tokenizer has none"
    )
    path = write_jsonl(tmp_path / "plain.jsonl", ROWS)
    with pytest.raises(DataError, match=r"row 0 \(line 1\): key 'prompt': data.apply_chat_template=true needs"):
        prepare_datasets(data_config(path, apply_chat_template=True), tokenizer)


def test_long_prompts_are_left_out_counted_and_logged(tmp_path, caplog):
    from roll_lite.pipelines.ppo import PPOPipeline

    # BOS + characters: 4, 5 and 3 tokens; a limit of 4 leaves out row 1 only
    path = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    prepared = prepare_datasets(data_config(path, max_prompt_length=4), build_char_tokenizer())
    assert prepared.train.answers == ["21", "6"] and [len(ids) for ids in prepared.train.prompt_ids] == [4, 3]
    note = (
        f"data.train_files: {path}: 1 of 3 prompts are longer than data.max_prompt_length=4 tokens and are "
        "left out (the first: row 1, 5 tokens)"
    )
    assert prepared.notes == [note, f"data.train_files: {path}: 2 prompts"]
    pipeline = PPOPipeline(load_config(None, [f"data.train_files={path}", "data.max_prompt_length=4"]))
    with caplog.at_level(logging.INFO, logger="roll_lite"):
        pipeline.prepare_data()
    assert note in caplog.messages and len(pipeline.train_data) == 2 and pipeline.sampler.num_rows == 2
    with pytest.raises(
        DataError,
        match=r"row 2 \(line 3\): key 'prompt': every prompt is longer than "
        r"data.max_prompt_length=2 tokens; the shortest, this one, has 3",
    ):
        prepare_datasets(data_config(path, max_prompt_length=2), build_char_tokenizer())


def test_a_saved_dataset_dict_asks_for_one_split(tmp_path):
    import datasets

    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(ROWS), "test": datasets.Dataset.from_list(ROWS)}
    ).save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(
        DataError,
        match=r"^data.train_files: '.*dict' holds several splits \(train, test\); name one "
        r"split's folder, e.g. '.*dict/train'$",
    ):
        prepare_datasets(data_config(tmp_path / "dict"), build_char_tokenizer())
    prepared = prepare_datasets(data_config(tmp_path / "dict" / "test"), build_char_tokenizer())
    assert prepared.train.answers == ["21", "543", "6"]


def test_a_dotted_answer_key_reads_a_nested_field_as_verl_parquet_files_keep_it(tmp_path):
    import datasets

    # verl's GSM8K preprocessing: chat-message prompts, the answer in reward_model.ground_truth
    rows = [
        {"prompt": [{"role": "user", "content": "1+1="}], "reward_model": {"style": "rule", "ground_truth": "2"}},
        {"prompt": [{"role": "user", "content": "2+2="}], "reward_model": {"style": "rule", "ground_truth": "4"}},
    ]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "train.parquet"))
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    config = data_config(tmp_path / "train.parquet", answer_key="reward_model.ground_truth")
    prepared = prepare_datasets(config, tokenizer)
    assert prepared.train.answers == ["2", "4"]
    assert prepared.train.extras[0] == {"reward_model": {"style": "rule", "ground_truth": "2"}}
    config.answer_key = "reward_model.answer"
    with pytest.raises(DataError, match=r"row 0: key 'reward_model.answer' \(data.answer_key\) is missing or null$"):
        prepare_datasets(config, tokenizer)
    config.answer_key = "solution.answer"
    with pytest.raises(
        DataError,
        match=r"row 0: key 'solution.answer' \(data.answer_key\) is missing; the file's "
        r"columns: prompt, reward_model$",
    ):
        prepare_datasets(config, tokenizer)
