"""Prompt datasets: load the `data:` files, validate every row, tokenize, filter by length.

Each row gives a prompt (`data.prompt_key`: a string, or a list of chat messages), a ground-truth
answer (`data.answer_key`) and extra fields for the reward (`data.extra_keys`, default: every other
column). Chat messages, and string prompts under `data.apply_chat_template`, go through the
tokenizer's chat template; other string prompts are BOS + their tokens. Prompts longer than
`data.max_prompt_length` tokens are left out and counted (never truncated); when none is left, or
a row is bad, a DataError names the config key, the file, the row and the field.

`prepare_datasets` does it all in the driver, before Ray or the run directory exist.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from roll_lite.data.chat import as_messages, has_chat_template, message_problem, render_chat
from roll_lite.data.files import DataError, Table
from roll_lite.data.lengths import load_within_limit

if TYPE_CHECKING:
    from roll_lite.data.image_prompts import ImageEncoder


@dataclass
class PromptData:
    prompt_ids: list[list[int]]
    prompts: list[Any]  # as in the file: a string or a list of chat messages
    answers: list[str]
    extras: list[dict] = field(default_factory=list)  # per row: the fields handed to the reward
    # data.image_key: per row its processor outputs {pixel_values, image_grid_thw} (roll_lite/data/image_prompts.py),
    # which prompt_ids' image tokens stand for; empty: a text data set
    images: list[dict] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.prompt_ids)

    def select(self, indices: Sequence[int]) -> "PromptData":
        return PromptData(
            [self.prompt_ids[i] for i in indices],
            [self.prompts[i] for i in indices],
            [self.answers[i] for i in indices],
            [self.extras[i] for i in indices],
            [self.images[i] for i in indices] if self.images else [],
        )

    @staticmethod
    def concat(parts: Sequence["PromptData"]) -> "PromptData":
        return PromptData(
            [x for p in parts for x in p.prompt_ids],
            [x for p in parts for x in p.prompts],
            [x for p in parts for x in p.answers],
            [x for p in parts for x in p.extras],
            [x for p in parts for x in p.images],
        )


@dataclass
class PreparedData:
    train: PromptData
    eval: Optional[PromptData]
    notes: list[str]  # what to log once everything is known to be good (rows read, prompts left out)


def prepare_datasets(
    data,
    tokenizer,
    domains: Sequence[str] | None = None,
    row_check: Callable[[dict], None] | None = None,
    seed: int = 0,
    encode_images: "ImageEncoder | None" = None,
) -> PreparedData:
    """Train and eval prompts of a `DataConfig`; raises DataError (one line) on any bad input. With
    `domains` (reward.domains' names) every row's data.domain_key field must name one of them;
    `row_check(extra)` raises ValueError on a row a reward source cannot score (the code source's tests).
    With data.source the rows come from that package (roll_lite.data.sources), seeded by `seed`. With
    data.image_key, `encode_images` renders each row (roll_lite/data/image_prompts.py); None: the model reads
    no images, and the rows are checked, then refused."""
    if getattr(data, "source", None) is not None:
        from roll_lite.data.sources import source_tables

        train_table, eval_table = source_tables(data, seed)
        train, notes = load_prompts([train_table], "data.source", data, tokenizer, domains, row_check)
        evaluation = None
        if eval_table is not None:
            evaluation, eval_notes = load_prompts([eval_table], "data.source", data, tokenizer, domains, row_check)
            notes += eval_notes
        return PreparedData(train, evaluation, notes)
    if not data.train_files:
        raise DataError(
            "data.train_files: no training file given (a .jsonl, .json, .parquet file or a saved dataset folder)"
        )
    if getattr(data, "image_key", None) is not None and encode_images is None:
        from roll_lite.data.image_prompts import refuse_without_encoder

        refuse_without_encoder(data)  # a text model: the images checked, then a config error
    checks = (domains, row_check, encode_images)
    train, notes = load_prompts(data.train_files, "data.train_files", data, tokenizer, *checks)
    evaluation = None
    if data.eval_files:
        evaluation, eval_notes = load_prompts(data.eval_files, "data.eval_files", data, tokenizer, *checks)
        notes += eval_notes
    return PreparedData(train, evaluation, notes)


def load_prompts(
    files: Sequence[str | Table],
    config_key: str,
    data,
    tokenizer,
    domains: Sequence[str] | None = None,
    row_check: Callable[[dict], None] | None = None,
    encode_images: "ImageEncoder | None" = None,
) -> tuple[PromptData, list[str]]:
    """The rows of `files`, concatenated in order, minus the prompts over max_prompt_length."""
    return load_within_limit(
        files,
        config_key,
        to_rows=lambda table: rows_to_prompts(table, data, tokenizer, domains, row_check, encode_images),
        lengths=lambda prompts: [len(ids) for ids in prompts.prompt_ids],
        limit=data.max_prompt_length,
        limit_key="data.max_prompt_length",
        noun=("prompt", "prompts"),
        concat=PromptData.concat,
        error_prefix=f"key '{data.prompt_key}': ",
    )


def rows_to_prompts(
    table: Table,
    data,
    tokenizer,
    domains: Sequence[str] | None = None,
    row_check: Callable[[dict], None] | None = None,
    encode_images: "ImageEncoder | None" = None,
) -> PromptData:
    """Validated, tokenized rows of one file (nothing filtered yet); image rows rendered by `encode_images`."""
    prompts, answers, extras = [], [], []
    chat_rows = []
    for i, row in enumerate(table.rows):
        prompt = _prompt(table, i, row, data.prompt_key, parts=getattr(data, "image_key", None) is not None)
        use_chat = data.apply_chat_template or not isinstance(prompt, str)
        if use_chat and not has_chat_template(tokenizer):
            if isinstance(prompt, str):
                need, fix = "data.apply_chat_template=true needs", "set data.apply_chat_template=false"
            else:
                need, fix = "chat messages need", "give prompts as strings"
            raise DataError(
                f"{table.where(i)}: key '{data.prompt_key}': {need} the tokenizer's chat template and the "
                f"tokenizer has none (model.tokenizer_path: use one with a chat_template, or {fix})"
            )
        chat_rows.append(use_chat)
        prompts.append(prompt)
        answers.append(_answer(table, i, row, data.answer_key))
        extras.append(_extras(table, i, row, data))
        if domains is not None:
            extras[-1][data.domain_key] = _domain(table, i, row, data.domain_key, domains)
        if row_check is not None:
            try:
                row_check(extras[-1])
            except ValueError as error:
                raise DataError(f"{table.where(i)}: {error}") from None
    if encode_images is not None:  # the processor renders them (docs/vision.md)
        from roll_lite.data.image_prompts import encode_image_rows

        image_ids, images = encode_image_rows(table, data, encode_images)
        return PromptData(image_ids, prompts, answers, extras, images)
    plain = [i for i, chat in enumerate(chat_rows) if not chat]
    ids: list[list[int]] = [[] for _ in prompts]
    if plain:
        bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
        encoded = tokenizer([prompts[i] for i in plain], add_special_tokens=False)["input_ids"]
        for i, tokens in zip(plain, encoded):
            ids[i] = bos + list(tokens)
    for i, chat in enumerate(chat_rows):
        if chat:
            try:
                ids[i] = render_chat(tokenizer, as_messages(prompts[i]))
            except Exception as error:  # a template may raise on messages it does not accept (e.g. roles)
                raise DataError(
                    f"{table.where(i)}: key '{data.prompt_key}': the tokenizer's chat template "
                    f"failed: {str(error).splitlines()[0] if str(error) else type(error).__name__}"
                ) from None
    return PromptData(ids, prompts, answers, extras)


def _missing(table: Table, row: int, key: str, what: str) -> DataError:
    if key not in table.columns and key.split(".")[0] not in table.columns:
        return DataError(
            f"{table.where(row)}: key '{key}' ({what}) is missing; the file's columns: {', '.join(table.columns)}"
        )
    return DataError(f"{table.where(row)}: key '{key}' ({what}) is missing or null")


def _prompt(table: Table, i: int, row: dict, key: str, parts: bool = False) -> Any:
    prompt = row.get(key)
    if prompt is None:
        raise _missing(table, i, key, "data.prompt_key")
    if isinstance(prompt, str):
        if not prompt.strip():
            raise DataError(f"{table.where(i)}: key '{key}': the prompt is empty")
        return prompt
    problem = message_problem(prompt, parts)
    if problem is not None:
        raise DataError(f"{table.where(i)}: key '{key}': the prompt {problem}")
    return prompt


def _nested(row: dict, key: str) -> Any:
    """row[key]; for a dotted key that is not a column, the field inside nested dicts, e.g.
    'reward_model.ground_truth' (verl's Parquet files keep the answer there)."""
    if key in row or "." not in key:
        return row.get(key)
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _answer(table: Table, i: int, row: dict, key: str) -> str:
    answer = _nested(row, key)
    if answer is None:
        raise _missing(table, i, key, "data.answer_key")
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        raise DataError(
            f"{table.where(i)}: key '{key}': the answer must be a string or a number, got "
            f"{type(answer).__name__} (structured ground truth can go in another column: "
            f"the reward gets it as an extra field)"
        )
    if isinstance(answer, float) and answer.is_integer():
        return str(int(answer))  # arrow reads a column of 2 and 0.5 as floats: 2 stays "2", not "2.0"
    return answer if isinstance(answer, str) else str(answer)


def _extras(table: Table, i: int, row: dict, data) -> dict:
    if data.extra_keys is None:
        return {k: v for k, v in row.items() if k not in (data.prompt_key, data.answer_key)}
    for key in data.extra_keys:
        if key not in table.columns:
            raise _missing(table, i, key, "data.extra_keys")
    return {key: row[key] for key in data.extra_keys}


def _domain(table: Table, i: int, row: dict, key: str, domains: Sequence[str]) -> str:
    """The row's domain, one that reward.domains maps: never a silent fallback to another's sources."""
    domain = row.get(key)
    if domain is None:
        raise _missing(table, i, key, "data.domain_key: reward.domains routes each row by it")
    if domain not in domains:
        raise DataError(
            f"{table.where(i)}: key '{key}': domain {domain!r} is not a configured domain "
            f"({', '.join(domains)}: reward.domains, else data.domain_weights); add it there or leave its rows out"
        )
    return domain
