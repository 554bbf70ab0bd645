"""Length filtering shared by the prompt and SFT datasets: rows over a token limit are left out,
counted and logged, never truncated; when every row of every file is too long, one DataError names
the shortest of them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence, TypeVar

from roll_lite.data.files import DataError, Table, read_table

if TYPE_CHECKING:
    from typing import Protocol

    Selected = TypeVar("Selected", bound="SelectableRows")

    class SelectableRows(Protocol):
        def __len__(self) -> int: ...
        def select(self: Selected, indices: list[int]) -> Selected: ...


Rows = TypeVar("Rows", bound="SelectableRows")  # PromptData or SFTData: len(), select(indices), concat(parts)


def load_within_limit(
    files: Sequence[str | Table],
    config_key: str,
    to_rows: Callable[[Table], Rows],
    lengths: Callable[[Rows], list[int]],
    limit: int | None,
    limit_key: str,
    noun: tuple[str, str],
    concat: Callable[[list[Rows]], Rows],
    error_prefix: str = "",
) -> tuple[Rows, list[str]]:
    """The rows of `files` (read_table unless already a Table, then `to_rows`), concatenated in order, minus those with more
    than `limit` tokens; and the notes to log. `noun`: a row, singular and plural ('prompt', 'prompts')."""
    one, what = noun
    parts, notes, shortest = [], [], None
    for file in files:  # a path, or a table of rows from a package (roll_lite.data.sources)
        table = file if isinstance(file, Table) else read_table(file, config_key)
        path = table.path
        rows = to_rows(table)
        sizes = lengths(rows)
        kept = [i for i, size in enumerate(sizes) if limit is None or size <= limit]
        if len(kept) < len(sizes):
            assert limit is not None  # rows were left out, so there is a limit
            first = next(i for i, size in enumerate(sizes) if size > limit)
            notes.append(
                f"{config_key}: {path}: {len(sizes) - len(kept)} of {len(sizes)} {what} are longer than "
                f"{limit_key}={limit} tokens and are left out (the first: row {first}, {sizes[first]} tokens)"
            )
            row = min(range(len(sizes)), key=sizes.__getitem__)
            if shortest is None or sizes[row] < shortest[0]:
                shortest = (sizes[row], table.where(row))
        parts.append(rows.select(kept))
        notes.append(f"{config_key}: {path}: {len(kept)} {what}")
    result = concat(parts)
    if not len(result):
        assert shortest is not None  # every file has rows (read_table), so every row was over the limit
        raise DataError(
            f"{shortest[1]}: {error_prefix}every {one} is longer than {limit_key}={limit} tokens; "
            f"the shortest, this one, has {shortest[0]}"
        )
    return result, notes
