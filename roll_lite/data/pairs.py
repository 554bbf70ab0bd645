"""Preference pairs: load the `preference:` files, validate every row, tokenize both sides, and
lay a batch of pairs out as the pair losses read it (roll_lite/loss/preference.py).

A row holds a prompt (`preference.prompt_key`: a string or chat messages), a chosen and a rejected
response (`chosen_key`, `rejected_key`): strings, or the assistant's message(s) that follow the
prompt (TRL's conversational form). Each side is tokenized exactly as SFT tokenizes a prompt and a
response (roll_lite/data/sft.py), so its targets are the response's tokens (+ <eos>), or its
assistant turns. A missing field, an empty side or two identical sides is a DataError naming the
row. Pairs whose longer side is over `preference.max_length` tokens are left out and counted.

With `data.image_key` every prompt holds images (chat messages with image parts, as the RL rows': roll_lite/data/
image_sequences.py): each side's ids are the processor's, each image placeholder expanded once, and the chosen
and the rejected side share the prompt's image inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, cast

import torch

from roll_lite.data import DataProto
from roll_lite.data.chat import as_messages, has_chat_template, message_problem, render_chat
from roll_lite.data.files import DataError, Table
from roll_lite.data.image_sequences import ImageColumn, image_sequence, row_pictures
from roll_lite.data.lengths import load_within_limit
from roll_lite.data.sequences import build_target_batch
from roll_lite.data.sft import conversation_sequence, plain_sequences

SIDES = ("chosen", "rejected")
# The masks of a pair batch, which the pair losses read, declared as its loss_mask_keys so that the strategy
# counts each of them and the loss checker knows them all: chosen_mask's sample count is the step's pair count.
PAIR_MASK_KEYS = ("chosen_mask", "rejected_mask", "score_mask")


@dataclass
class PairData:
    chosen: list[tuple[list[int], list[int]]]  # (token ids, target mask) of each pair's chosen side
    rejected: list[tuple[list[int], list[int]]]
    margins: Optional[list[float]] = None  # preference.margin_key's values
    images: Optional[list[dict]] = None  # data.image_key: each pair's prompt's image inputs, both sides'

    def __len__(self) -> int:
        return len(self.chosen)

    def select(self, indices: Sequence[int]) -> "PairData":
        margins = None if self.margins is None else [self.margins[i] for i in indices]
        images = None if self.images is None else [self.images[i] for i in indices]
        return PairData([self.chosen[i] for i in indices], [self.rejected[i] for i in indices], margins, images)

    @staticmethod
    def concat(parts: Sequence["PairData"]) -> "PairData":
        margins = (
            None
            if any(p.margins is None for p in parts)
            else [m for p in parts for m in cast("list[float]", p.margins)]
        )
        images = None if any(p.images is None for p in parts) else [x for p in parts for x in p.images or []]
        return PairData([x for p in parts for x in p.chosen], [x for p in parts for x in p.rejected], margins, images)

    def lengths(self) -> list[int]:
        """The longer side's token count, pair by pair."""
        return [max(len(c[0]), len(r[0])) for c, r in zip(self.chosen, self.rejected)]


@dataclass
class PreparedPairs:
    train: PairData
    eval: Optional[PairData]
    notes: list[str]


def prepare_pair_datasets(preference, tokenizer, images: ImageColumn | None = None) -> PreparedPairs:
    """Train and eval pairs of a `PreferenceConfig`; raises DataError (one line) on any bad input. With
    `images` (data.image_key) every prompt's images are read and rendered by the processor."""
    if not preference.train_files:
        raise DataError(
            "preference.train_files: no training file given (a .jsonl, .json, .parquet file or a saved "
            "dataset folder of prompt / chosen / rejected rows)"
        )
    train, notes = load_pair_files(preference.train_files, "preference.train_files", preference, tokenizer, images)
    evaluation = None
    if preference.eval_files:
        evaluation, eval_notes = load_pair_files(
            preference.eval_files, "preference.eval_files", preference, tokenizer, images
        )
        notes += eval_notes
    return PreparedPairs(train, evaluation, notes)


def load_pair_files(
    files: Sequence[str], config_key: str, preference, tokenizer, images: ImageColumn | None = None
) -> tuple[PairData, list[str]]:
    return load_within_limit(
        files,
        config_key,
        to_rows=lambda table: rows_to_pairs(table, preference, tokenizer, images),
        lengths=PairData.lengths,
        limit=preference.max_length,
        limit_key="preference.max_length",
        noun=("pair", "pairs"),
        concat=PairData.concat,
    )


def rows_to_pairs(table: Table, preference, tokenizer, images: ImageColumn | None = None) -> PairData:
    """Validated, tokenized pairs of one file (nothing filtered yet); with `images`, each prompt's images."""
    chosen, rejected, margins, inputs = [], [], [], []
    for i, row in enumerate(table.rows):
        prompt = _value(table, i, row, preference.prompt_key, "prompt_key")
        if isinstance(prompt, str) and not prompt.strip():
            raise DataError(f"{table.where(i)}: key '{preference.prompt_key}': the prompt is empty")
        if not isinstance(prompt, str) and (problem := message_problem(prompt, images is not None)) is not None:
            raise DataError(f"{table.where(i)}: key '{preference.prompt_key}': the prompt {problem}")
        pictures = None if images is None else row_pictures(table, i, images, preference.prompt_key)
        sides = [_side(table, i, row, getattr(preference, f"{side}_key"), side) for side in SIDES]
        if sides[0] == sides[1]:
            raise DataError(
                f"{table.where(i)}: keys '{preference.chosen_key}' and '{preference.rejected_key}': the chosen "
                "and the rejected response are the same, so the pair prefers nothing"
            )
        (chosen_ids, chosen_images), (rejected_ids, rejected_images) = (
            _tokenize(table, i, prompt, side, preference, tokenizer, images, pictures) for side in sides
        )
        chosen.append(chosen_ids)
        rejected.append(rejected_ids)
        if images is not None:  # one processor call per side: the prompt's images, the same inputs for both
            assert all(torch.equal(chosen_images[k], rejected_images[k]) for k in chosen_images), table.where(i)
            inputs.append(chosen_images)
        if preference.margin_key is not None:
            margins.append(_margin(table, i, row, preference.margin_key))
    return PairData(
        chosen, rejected, margins if preference.margin_key is not None else None, None if images is None else inputs
    )


def _value(table: Table, i: int, row: dict, column: str, key: str):
    value = row.get(column)
    if value is None:
        raise DataError(
            f"{table.where(i)}: key '{column}' (preference.{key}) is missing or null; the file's columns: "
            f"{', '.join(table.columns)}"
        )
    return value


def _side(table: Table, i: int, row: dict, column: str, side: str):
    value = _value(table, i, row, column, f"{side}_key")
    if isinstance(value, str):
        if not value.strip():
            raise DataError(f"{table.where(i)}: key '{column}': the {side} response is empty")
        return value
    problem = message_problem(value)
    if problem is not None:
        raise DataError(
            f"{table.where(i)}: key '{column}': the {side} response is not a string, and its messages: {problem}"
        )
    if value[-1]["role"] != "assistant" or not any(m["content"].strip() for m in value if m["role"] == "assistant"):
        raise DataError(
            f"{table.where(i)}: key '{column}': the {side} messages must end with a non-empty assistant message"
        )
    return value


def _tokenize(
    table: Table, i: int, prompt, side, preference, tokenizer, images: ImageColumn | None, pictures
) -> tuple[tuple[list[int], list[int]], dict]:
    """((ids, target mask), image inputs: {} without images) of one side."""
    if isinstance(prompt, str) and isinstance(side, str) and not preference.apply_chat_template:
        return plain_sequences(tokenizer, [prompt], [side])[0], {}  # never with images: row_pictures says so
    if not has_chat_template(tokenizer):
        raise DataError(
            f"{table.where(i)}: chat messages (or preference.apply_chat_template=true) need the tokenizer's "
            "chat template and the tokenizer has none (model.tokenizer_path)"
        )
    before = as_messages(prompt)
    messages = before + as_messages(side, role="assistant")
    try:
        ids, mask = conversation_sequence(tokenizer, messages)
        # the targets are the response's assistant turns, not those of a conversation in the prompt
        prompt_length = len(render_chat(tokenizer, before, add_generation_prompt=False))
        mask = [0] * prompt_length + mask[prompt_length:]
        if images is None:
            return (ids, mask), {}
        ids, mask, inputs = image_sequence(images.processor, messages, pictures, ids, mask)
    except ValueError as error:
        raise DataError(f"{table.where(i)}: {error}") from None
    return (ids, mask), inputs


def _margin(table: Table, i: int, row: dict, column: str) -> float:
    value = _value(table, i, row, column, "margin_key")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise DataError(
            f"{table.where(i)}: key '{column}' (preference.margin_key): the margin must be a number, got {value!r}"
        )
    return float(value)


def build_pair_batch(pairs: PairData, pad_token_id: int) -> DataProto:
    """Pairs as consecutive right-padded rows, chosen then rejected (meta_info['rows_together'] = 2):
    input_ids, attention_mask, chosen_mask / rejected_mask (each side's target tokens), score_mask (the
    last token that is not padding, where transformers' sequence classifiers read the score), and
    margin ([rows], with margins). loss_mask_keys: PAIR_MASK_KEYS."""
    sequences = [side for pair in zip(pairs.chosen, pairs.rejected) for side in pair]
    images = None if pairs.images is None else [entry for entry in pairs.images for _ in SIDES]  # both sides'
    batch = build_target_batch([ids for ids, _ in sequences], [mask for _, mask in sequences], pad_token_id, images)
    targets = batch.batch.pop("response_mask")
    is_chosen = (torch.arange(len(sequences)) % 2 == 0)[:, None]
    batch.batch["chosen_mask"] = targets * is_chosen
    batch.batch["rejected_mask"] = targets * ~is_chosen
    batch.batch["score_mask"] = score_positions(batch["input_ids"], batch["attention_mask"], pad_token_id)
    if pairs.margins is not None:
        batch.batch["margin"] = torch.tensor(pairs.margins, dtype=torch.float64).repeat_interleave(2)
    batch.meta_info.update(loss_mask_keys=list(PAIR_MASK_KEYS), rows_together=2)
    return batch


def score_positions(input_ids: torch.Tensor, attention_mask: torch.Tensor, pad_token_id: int) -> torch.Tensor:
    """1 at each row's last token whose id is not the pad id: the token whose hidden state a transformers
    *ForSequenceClassification scores, so that the exported reward model gives the trained scores."""
    real = attention_mask.bool() & (input_ids != pad_token_id)
    if not real.any(-1).all():
        raise ValueError("score_positions: a row holds only pad tokens, so no token can carry its score")
    positions = torch.arange(input_ids.shape[1]).expand_as(input_ids)
    last = torch.where(real, positions, -1).amax(-1)
    return (positions == last[:, None]).long()
