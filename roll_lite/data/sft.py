"""SFT datasets: load the `sft:` files, validate every row, tokenize into (token ids, target mask).

A row is either a prompt and a response (`sft.prompt_key`, `sft.response_key`), or, with
`sft.response_key: null`, a whole conversation of chat messages in `sft.prompt_key`. The targets are
the response tokens (+ <eos>), or every assistant turn of the conversation.

Tokenized as RL sees the same text, so an SFT model starts RL on familiar prompts:
- a string prompt without a chat template: BOS + prompt tokens, then the response tokens + <eos>
  (prompt and response tokenized separately, as the rollout generates the response after the prompt);
- chat messages, or a string prompt under `sft.apply_chat_template`: the tokenizer's chat template.
  Each assistant turn's targets are the tokens the template adds between "the messages before it +
  the generation prompt" and "the messages up to and including it" (e.g. ChatML: the content,
  <|im_end|> and the newline). The template must render each such prefix as a prefix of the whole.

With `data.image_key` every row holds images in its chat messages (roll_lite/data/image_sequences.py): the
targets are found as above, the ids are the processor's (each image placeholder expanded once), and the row
keeps its image inputs.

Sequences longer than `sft.max_length` tokens (image tokens included) are left out and counted, never truncated.
With `sft.from_data_source` the rows are data.source's training rows (prompt, the package's answer).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence

from roll_lite.data.chat import as_messages, has_chat_template, message_problem, render_chat
from roll_lite.data.files import DataError, Table
from roll_lite.data.image_sequences import ImageColumn, image_sequence, row_pictures
from roll_lite.data.lengths import load_within_limit


@dataclass
class SFTData:
    input_ids: list[list[int]]
    target_masks: list[list[int]]  # 1 on the tokens the loss is on
    images: Optional[list[dict]] = None  # data.image_key: each row's image inputs {pixel_values, image_grid_thw}

    def __len__(self) -> int:
        return len(self.input_ids)

    def select(self, indices: Sequence[int]) -> "SFTData":
        images = None if self.images is None else [self.images[i] for i in indices]
        return SFTData([self.input_ids[i] for i in indices], [self.target_masks[i] for i in indices], images)

    @staticmethod
    def concat(parts: Sequence["SFTData"]) -> "SFTData":
        images = None if any(p.images is None for p in parts) else [x for p in parts for x in p.images or []]
        return SFTData([x for p in parts for x in p.input_ids], [x for p in parts for x in p.target_masks], images)

    @property
    def num_targets(self) -> int:
        return sum(sum(mask) for mask in self.target_masks)


@dataclass
class PreparedSFT:
    train: SFTData
    eval: Optional[SFTData]
    notes: list[str]


def prepare_sft_datasets(sft, tokenizer, data=None, seed: int = 0, images: ImageColumn | None = None) -> PreparedSFT:
    """Train and eval sequences of an `SFTConfig`; raises DataError (one line) on any bad input.
    With sft.from_data_source the training rows are `data.source`'s, seeded by `seed` as RL's are. With
    `images` (data.image_key) every row's images are read and rendered by the processor."""
    if sft.from_data_source:
        train, notes = source_sequences(sft, tokenizer, data, seed)
    elif not sft.train_files:
        raise DataError(
            "sft.train_files: no training file given (a .jsonl, .json, .parquet file or a saved dataset folder)"
        )
    else:
        train, notes = load_sft_files(sft.train_files, "sft.train_files", sft, tokenizer, images)
    evaluation = None
    if sft.eval_files:
        evaluation, eval_notes = load_sft_files(sft.eval_files, "sft.eval_files", sft, tokenizer, images)
        notes += eval_notes
    return PreparedSFT(train, evaluation, notes)


def load_sft_files(
    files: Sequence[str | Table], config_key: str, sft, tokenizer, images: ImageColumn | None = None
) -> tuple[SFTData, list[str]]:
    """The rows of `files`, concatenated in order, minus the sequences over sft.max_length."""
    return load_within_limit(
        files,
        config_key,
        to_rows=lambda table: rows_to_sequences(table, sft, tokenizer, images),
        lengths=lambda sequences: [len(ids) for ids in sequences.input_ids],
        limit=sft.max_length,
        limit_key="sft.max_length",
        noun=("sequence", "sequences"),
        concat=SFTData.concat,
    )


def source_sequences(sft, tokenizer, data, seed: int) -> tuple[SFTData, list[str]]:
    """data.source's training rows (the held-out ones never: roll_lite.data.sources keeps them apart),
    each its RL prompt, rendered as RL renders it (data.apply_chat_template), and the package's
    reference answer as the response."""
    from roll_lite.data.sources import source_tables

    rows = source_tables(replace(data, source_eval_size=0), seed)[0]
    pairs = [{"prompt": row[data.prompt_key], "response": row[data.answer_key]} for row in rows.rows]
    table = Table(rows.path, "sft.from_data_source", pairs, ["prompt", "response"])
    plain = replace(sft, prompt_key="prompt", response_key="response", apply_chat_template=data.apply_chat_template)
    return load_sft_files([table], "sft.from_data_source", plain, tokenizer)


def rows_to_sequences(table: Table, sft, tokenizer, images: ImageColumn | None = None) -> SFTData:
    """Validated, tokenized rows of one file (nothing filtered yet); with `images`, each row's images."""
    pairs, chats, pictures = [], [], {}  # (row, prompt, response) / (row, messages) / row: its images
    for i, row in enumerate(table.rows):
        prompt = _field(table, i, row, sft.prompt_key, "sft.prompt_key", parts=images is not None)
        if images is not None:  # chat messages, one image part per image, none in an assistant message
            pictures[i] = row_pictures(table, i, images, sft.prompt_key)
        if sft.response_key is None:
            if isinstance(prompt, str):
                raise DataError(
                    f"{table.where(i)}: key '{sft.prompt_key}': sft.response_key is null, so the column must "
                    f"hold whole conversations (chat messages), got a string"
                )
            chats.append((i, _conversation(table, i, prompt, sft.prompt_key)))
            continue
        response = _field(table, i, row, sft.response_key, "sft.response_key")
        if not isinstance(response, str):
            raise DataError(
                f"{table.where(i)}: key '{sft.response_key}': the response must be a string, got "
                f"{type(response).__name__}"
            )
        if isinstance(prompt, str) and not sft.apply_chat_template:
            pairs.append((i, prompt, response))  # never a row with images: its prompt is chat messages
        else:
            chats.append((i, as_messages(prompt) + [{"role": "assistant", "content": response}]))
    if chats and not has_chat_template(tokenizer):
        i = chats[0][0]
        raise DataError(
            f"{table.where(i)}: key '{sft.prompt_key}': chat messages (or sft.apply_chat_template=true) need the "
            f"tokenizer's chat template and the tokenizer has none (model.tokenizer_path)"
        )
    input_ids: list[list[int]] = [[] for _ in table.rows]
    masks: list[list[int]] = [[] for _ in table.rows]
    inputs: list[dict] = [{} for _ in table.rows]
    if pairs:
        for (i, _, _), (ids, mask) in zip(
            pairs, plain_sequences(tokenizer, [p for _, p, _ in pairs], [r for _, _, r in pairs])
        ):
            input_ids[i], masks[i] = ids, mask
    for i, messages in chats:
        try:
            input_ids[i], masks[i] = conversation_sequence(tokenizer, messages)
            if images is not None:
                input_ids[i], masks[i], inputs[i] = image_sequence(
                    images.processor, messages, pictures[i], input_ids[i], masks[i]
                )
        except ValueError as error:
            raise DataError(f"{table.where(i)}: key '{sft.prompt_key}': {error}") from None
    return SFTData(input_ids, masks, None if images is None else inputs)


def plain_sequences(tokenizer, prompts: list[str], responses: list[str]) -> list[tuple[list[int], list[int]]]:
    """BOS + prompt, then response + <eos> as the targets (one batched tokenizer call per side)."""
    if tokenizer.eos_token_id is None:
        raise DataError("model.tokenizer_path: the tokenizer has no eos token; SFT ends every response with it")
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    response_ids = tokenizer(responses, add_special_tokens=False)["input_ids"]
    sequences = []
    for prompt, response in zip(prompt_ids, response_ids):
        prompt, targets = bos + list(prompt), list(response) + [tokenizer.eos_token_id]
        sequences.append((prompt + targets, [0] * len(prompt) + [1] * len(targets)))
    return sequences


def conversation_sequence(tokenizer, messages: list[dict]) -> tuple[list[int], list[int]]:
    """(token ids, target mask) of a conversation under the chat template: targets on every
    assistant turn. ValueError when the template does not render turns as prefixes of the whole."""
    full = _render(tokenizer, messages, generation_prompt=False)
    mask = [0] * len(full)
    for turn, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:turn], generation_prompt=True) if turn else []
        through = _render(tokenizer, messages[: turn + 1], generation_prompt=False)
        if full[: len(before)] != before or full[: len(through)] != through or len(through) <= len(before):
            raise ValueError(
                f"the chat template does not render message {turn} (assistant) as a continuation of the "
                f"messages before it, so its tokens cannot be told apart"
            )
        if not before:
            raise ValueError(
                "the conversation starts with an assistant message: the first target token needs "
                "at least one token before it"
            )
        mask[len(before) : len(through)] = [1] * (len(through) - len(before))
    return full, mask


def _render(tokenizer, messages: list[dict], generation_prompt: bool) -> list[int]:
    try:
        return render_chat(tokenizer, messages, generation_prompt)
    except Exception as error:  # a template may raise on messages it does not accept (e.g. roles)
        raise ValueError(
            f"the tokenizer's chat template failed: {str(error).splitlines()[0] if str(error) else type(error).__name__}"
        ) from None


def _field(table: Table, i: int, row: dict, key: str, config_key: str, parts: bool = False):
    value = row.get(key)
    if value is None:
        if key not in table.columns:
            raise DataError(
                f"{table.where(i)}: key '{key}' ({config_key}) is missing; the file's columns: "
                f"{', '.join(table.columns)}"
            )
        raise DataError(f"{table.where(i)}: key '{key}' ({config_key}) is missing or null")
    if isinstance(value, str) and not value.strip() and config_key == "sft.prompt_key":
        raise DataError(f"{table.where(i)}: key '{key}': the prompt is empty")
    if not isinstance(value, str) and config_key == "sft.prompt_key":
        problem = message_problem(value, parts)
        if problem is not None:
            raise DataError(f"{table.where(i)}: key '{key}': the prompt {problem}")
    return value


def _conversation(table: Table, i: int, messages: list[dict], key: str) -> list[dict]:
    roles = [m["role"] for m in messages]
    if "assistant" not in roles:
        raise DataError(f"{table.where(i)}: key '{key}': the conversation has no assistant message to train on")
    if roles[-1] != "assistant":
        raise DataError(
            f"{table.where(i)}: key '{key}': the conversation ends with a '{roles[-1]}' message; the loss is "
            f"on assistant turns, so end it with the assistant's (or drop the trailing turns)"
        )
    return messages
