"""Reading one data file into rows with the `datasets` library: JSONL / JSON, Parquet, or a folder
written by `Dataset.save_to_disk`. A JSONL file of flat rows of one schema is read with `json` alone,
to the same rows (`_plain_json_lines`).

What `datasets` reports opaquely is checked or translated here, into one line naming the config key
and the file (and the line, for JSONL): a missing file, an unknown format, bytes that are not UTF-8,
a line that is not a JSON object, a file without rows. Nothing is cached outside a temporary folder.
"""

from __future__ import annotations

import json
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, cast

FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
FORMAT_HELP = ".jsonl, .json, .parquet, or a folder written by Dataset.save_to_disk"


class DataError(ValueError):
    """A problem with a data file: one line naming the config key, the file, the row and the field."""


@dataclass
class Table:
    path: str
    config_key: str  # e.g. data.train_files
    rows: list[dict]
    columns: list[str]
    lines: Optional[list[int]] = None  # JSONL: the line number of each row (blank lines are skipped)

    def where(self, row: int) -> str:
        """'<config key>: <file>: row <i>' (+ the line for JSONL), the prefix of an error about a row."""
        line = f" (line {self.lines[row]})" if self.lines is not None and row < len(self.lines) else ""
        return f"{self.config_key}: {self.path}: row {row}{line}"


def file_format(path: Path, config_key: str) -> str:
    """'json', 'parquet' or 'saved' (a save_to_disk folder); DataError when none fits."""
    if not path.exists():
        raise DataError(f"{config_key}: no such file or folder '{path}'")
    if path.is_dir():
        if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
            return "saved"
        raise DataError(
            f"{config_key}: '{path}' is a folder but not one written by Dataset.save_to_disk "
            f"(no state.json or dataset_dict.json); formats: {FORMAT_HELP}"
        )
    kind = FORMATS.get(path.suffix.lower())
    if kind is None:
        raise DataError(f"{config_key}: '{path}': unknown format '{path.suffix or path.name}' (use {FORMAT_HELP})")
    return kind


def read_table(path: str | Path, config_key: str) -> Table:
    """The rows of one file as dicts (a key missing from a JSONL row reads as None)."""
    path = Path(path)
    kind = file_format(path, config_key)
    lines = _check_json_lines(path, config_key) if kind == "json" else None
    if path.suffix.lower() == ".jsonl" and (plain := _plain_json_lines(path)) is not None:
        rows, columns = plain
        return Table(str(path), config_key, rows, columns, lines)
    import datasets

    datasets.disable_progress_bars()
    level = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(logging.CRITICAL + 1)  # its own error logs would add lines to ours
    try:
        with tempfile.TemporaryDirectory(prefix="roll_lite_data_") as cache:
            if kind == "json":
                table = datasets.Dataset.from_json(str(path), keep_in_memory=True, cache_dir=cache)
            elif kind == "parquet":
                table = datasets.Dataset.from_parquet(str(path), keep_in_memory=True, cache_dir=cache)
            else:
                table = _load_saved(path, config_key)
            rows, columns = table.to_list(), list(table.column_names)
    except DataError:
        raise
    except Exception as error:  # datasets / pyarrow: translate into one line
        if kind == "json":
            _diagnose_json(path, config_key)
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        cause = (
            f" ({str(error.__cause__).splitlines()[0]})" if error.__cause__ is not None and str(error.__cause__) else ""
        )
        raise DataError(f"{config_key}: '{path}' cannot be read as {kind}: {first}{cause}") from None
    finally:
        datasets.logging.set_verbosity(level)
    if not rows:
        raise DataError(f"{config_key}: '{path}' has no rows")
    if lines is not None and len(lines) != len(rows):
        lines = None  # a .json file holding one array: rows are not lines
    return Table(str(path), config_key, rows, columns, lines)


SCALARS = (str, int, float, bool)


def _plain_json_lines(path: Path) -> tuple[list[dict], list[str]] | None:
    """A JSONL file whose rows datasets would return unchanged, read without it (its import and Arrow's
    round trip cost a run ~0.6 s of CPU): every line a JSON object, all with the same keys, each column
    of one scalar type (str, int within int64, float or bool). None for anything else (nested values,
    nulls, a key some rows lack, a column mixing types: Arrow's schema decides those), and datasets
    reads the file."""
    rows: list[dict] = []
    columns: list[str] | None = None
    types: dict[str, type] = {}
    with path.open(encoding="utf-8") as f:
        for text in f:
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except ValueError:
                return None
            if not isinstance(row, dict):
                return None
            if columns is None:
                columns, types = list(row), {key: type(value) for key, value in row.items()}
                if not all(kind in SCALARS for kind in types.values()):
                    return None
            elif row.keys() != types.keys() or any(type(row[key]) is not types[key] for key in columns):
                return None
            if any(type(value) is int and not -(2**63) <= value < 2**63 for value in row.values()):
                return None
            rows.append({key: row[key] for key in columns})
    return (rows, columns) if columns else None


def _load_saved(path: Path, config_key: str):
    import datasets

    loaded = datasets.load_from_disk(str(path), keep_in_memory=True)
    if isinstance(loaded, datasets.DatasetDict):
        raise DataError(
            f"{config_key}: '{path}' holds several splits ({', '.join(loaded)}); "
            f"name one split's folder, e.g. '{path / next(iter(loaded))}'"
        )
    return loaded


def _check_json_lines(path: Path, config_key: str) -> list[int]:
    """Checks that the file is UTF-8 (datasets says only 'can't decode byte'); returns the line
    number of every non-blank line, which is how rows map to lines in a JSONL file."""
    lines: list[int] = []
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise DataError(
                    f"{config_key}: {path}: line {number} (row {len(lines)}): byte 0x{raw[error.start]:02x} "
                    f"at column {error.start + 1} is not UTF-8 (save the file as UTF-8)"
                ) from None
            if text.strip():
                lines.append(number)
    if not lines:
        raise DataError(f"{config_key}: '{path}' has no rows")
    return lines


def _diagnose_json(path: Path, config_key: str) -> None:
    """After datasets failed on a JSON file: name the first line that is not a JSON object."""
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        return  # one JSON array, not JSON lines: the library's message is all there is
    first_seen: dict[str, tuple[str, int]]
    row, first_seen = 0, {}  # key -> (JSON type, row) of its first non-null value
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as error:
            # Some of json's messages end in "at" and expect the position: "Unterminated string starting at".
            at = "" if error.msg.endswith(" at") else " at"
            raise DataError(
                f"{config_key}: {path}: line {number} (row {row}): not valid JSON: {error.msg}{at} column {error.colno}"
            ) from None
        if not isinstance(value, dict):
            raise DataError(
                f"{config_key}: {path}: line {number} (row {row}): a JSON {type(value).__name__}, "
                f"not an object with the prompt and answer keys"
            ) from None
        for key, item in value.items():
            kind = _json_type(item)
            seen = first_seen.setdefault(key, (kind, row)) if kind != "null" else (kind, row)
            if seen[0] not in (kind, "null"):
                raise DataError(
                    f"{config_key}: {path}: line {number} (row {row}): key '{key}' is a {kind} where "
                    f"row {seen[1]} has a {seen[0]}; a column needs one type in every row"
                )
        row += 1


def _json_type(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return cast("dict[type[Any], str]", {str: "string", list: "list", dict: "object"})[type(value)]
