"""SFT data (roll_lite/data/sft.py): what the loss is on, for prompt + response rows and for chat
conversations; and one-line errors naming the file, row and key."""

import json

import pytest

from roll_lite.config import SFTConfig
from roll_lite.data import DataError
from roll_lite.data.sequences import build_target_batch
from roll_lite.data.sft import conversation_sequence, prepare_sft_datasets
from roll_lite.model.tokenizer import build_char_tokenizer

# A chat template in the characters the test tokenizer knows: "<role>content<end>\n" per message.
TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}<end>\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def chat_tokenizer(template=TEMPLATE):
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = template
    return tokenizer


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def targets(tokenizer, ids, mask):
    return tokenizer.decode([t for t, m in zip(ids, mask) if m])


def test_prompt_and_response_rows_train_on_the_response_and_eos(tmp_path):
    tokenizer = build_char_tokenizer()
    path = write_jsonl(
        tmp_path / "sft.jsonl", [{"prompt": "12=", "response": "21"}, {"prompt": "345=", "response": "543"}]
    )
    data = prepare_sft_datasets(SFTConfig(train_files=[path]), tokenizer).train
    ids, mask = data.input_ids[0], data.target_masks[0]
    # As the RL prompt is tokenized (BOS + prompt), then the response and <eos>.
    assert ids == [tokenizer.bos_token_id] + tokenizer("12=21", add_special_tokens=False)["input_ids"] + [
        tokenizer.eos_token_id
    ]
    assert mask == [0, 0, 0, 0, 1, 1, 1]
    assert data.num_targets == 3 + 4


def test_string_prompts_with_the_chat_template_train_on_the_assistant_turn(tmp_path):
    tokenizer = chat_tokenizer()
    path = write_jsonl(tmp_path / "sft.jsonl", [{"q": "12=", "a": "21"}])
    sft = SFTConfig(train_files=[path], prompt_key="q", response_key="a", apply_chat_template=True)
    data = prepare_sft_datasets(sft, tokenizer).train
    assert tokenizer.decode(data.input_ids[0], skip_special_tokens=True) == "<user>12=<end>\n<assistant>21<end>\n"
    assert targets(tokenizer, data.input_ids[0], data.target_masks[0]) == "21<end>\n"


def test_a_conversation_trains_on_every_assistant_turn_only(tmp_path):
    tokenizer = chat_tokenizer()
    conversation = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "12="},
        {"role": "assistant", "content": "21"},
        {"role": "user", "content": "and 345="},
        {"role": "assistant", "content": "543"},
    ]
    path = write_jsonl(tmp_path / "chat.jsonl", [{"messages": conversation}])
    sft = SFTConfig(train_files=[path], prompt_key="messages", response_key=None)
    data = prepare_sft_datasets(sft, tokenizer).train
    assert targets(tokenizer, data.input_ids[0], data.target_masks[0]) == "21<end>\n543<end>\n"
    batch = build_target_batch(data.input_ids, data.target_masks, tokenizer.pad_token_id)
    assert batch["response_mask"].sum() == len("21<end>\n543<end>\n")


def test_max_length_leaves_long_sequences_out_and_counts_them(tmp_path):
    tokenizer = build_char_tokenizer()
    rows = [{"prompt": "1=", "response": "1"}, {"prompt": "123456=", "response": "654321"}]
    path = write_jsonl(tmp_path / "sft.jsonl", rows)
    prepared = prepare_sft_datasets(SFTConfig(train_files=[path], max_length=6), tokenizer)
    assert len(prepared.train) == 1
    assert any(
        "1 of 2 sequences are longer than sft.max_length=6 tokens and are left out (the first: row 1, 15 tokens)"
        in note
        for note in prepared.notes
    )
    with pytest.raises(
        DataError,
        match=r"row 0 \(line 1\): every sequence is longer than sft.max_length=3 tokens; "
        r"the shortest, this one, has 5",
    ):
        prepare_sft_datasets(SFTConfig(train_files=[path], max_length=3), tokenizer)


def test_a_template_that_rewrites_earlier_turns_is_refused():
    # The generation prompt differs from how the assistant turn is rendered: targets cannot be cut out.
    template = (
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}<bot>{% endif %}"
    )
    messages = [{"role": "user", "content": "1="}, {"role": "assistant", "content": "1"}]
    with pytest.raises(ValueError, match="does not render message 1 \\(assistant\\) as a continuation"):
        conversation_sequence(chat_tokenizer(template), messages)


BAD_ROWS = {
    "missing response column": (
        [{"prompt": "1=", "answer": "1"}],
        {},
        "row 0 (line 1): key 'response' (sft.response_key) is missing; the file's columns: prompt, answer",
    ),
    "response not a string": (
        [{"prompt": "1=", "response": 1}],
        {},
        "row 0 (line 1): key 'response': the response must be a string, got int",
    ),
    "empty prompt": ([{"prompt": " ", "response": "1"}], {}, "row 0 (line 1): key 'prompt': the prompt is empty"),
    "string where a conversation is needed": (
        [{"prompt": "1=", "response": "1"}],
        {"response_key": None},
        "row 0 (line 1): key 'prompt': sft.response_key is null, so the column "
        "must hold whole conversations (chat messages), got a string",
    ),
    "conversation without an assistant": (
        [{"prompt": [{"role": "user", "content": "1="}]}],
        {"response_key": None},
        "row 0 (line 1): key 'prompt': the conversation has no assistant message",
    ),
    "conversation ending with the user": (
        [
            {
                "prompt": [
                    {"role": "user", "content": "1="},
                    {"role": "assistant", "content": "1"},
                    {"role": "user", "content": "2="},
                ]
            }
        ],
        {"response_key": None},
        "row 0 (line 1): key 'prompt': the conversation ends with a 'user' message",
    ),
    "chat without a template": (
        [{"prompt": "1=", "response": "1"}],
        {"apply_chat_template": True},
        "row 0 (line 1): key 'prompt': chat messages (or sft.apply_chat_template=true) need the "
        "tokenizer's chat template and the tokenizer has none",
    ),
}


@pytest.mark.parametrize("case", BAD_ROWS)
def test_bad_rows_name_the_file_row_and_key(tmp_path, case):
    rows, options, expected = BAD_ROWS[case]
    path = write_jsonl(tmp_path / "sft.jsonl", rows)
    with pytest.raises(DataError) as error:
        prepare_sft_datasets(SFTConfig(train_files=[path], **options), build_char_tokenizer())
    assert str(error.value).startswith(f"sft.train_files: {path}: {expected}"), str(error.value)
