"""Images in data rows: each read, decoded and checked in the driver, before Ray starts.

A row's image column holds one image or a list of them, each one of:
- a path (str), relative to the data file's folder unless absolute;
- the file's bytes;
- the image feature of a `datasets` table (Parquet or `save_to_disk`), which reads as
  {'bytes': ..., 'path': ...}: the bytes when present, else the path.

Chat messages place the images with content parts: `{"type": "image"}` marks where the next image of
the row goes, `{"type": "text", "text": ...}` holds text. A row needs exactly one image part per
image. A missing, unreadable or corrupt image is a DataError naming the data file, the row, the key
and, for a path, the image file.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

from roll_lite.data.files import DataError, Table

if TYPE_CHECKING:
    from PIL import Image


def row_images(table: Table, row: int, key: str) -> list["Image.Image"]:
    """The decoded RGB images of `table.rows[row][key]` (one image or a list of them)."""
    value = table.rows[row].get(key)
    if value is None:
        if key not in table.columns:
            raise DataError(
                f"{table.where(row)}: key '{key}' (data.image_key) is missing; the file's columns: "
                f"{', '.join(table.columns)}"
            )
        raise DataError(f"{table.where(row)}: key '{key}' (data.image_key) is null")
    values = value if isinstance(value, list) else [value]
    if not values:
        raise DataError(f"{table.where(row)}: key '{key}' (data.image_key) is an empty list of images")
    folder = Path(table.path).parent if Path(table.path).is_file() else Path(table.path)
    return [_decode(value, folder, f"{table.where(row)}: key '{key}': image {j}") for j, value in enumerate(values)]


def _decode(value: Any, folder: Path, where: str) -> "Image.Image":
    from PIL import Image, UnidentifiedImageError

    if isinstance(value, dict) and ("bytes" in value or "path" in value):  # the datasets Image feature
        value = value.get("bytes") or value.get("path")
    if isinstance(value, str):
        path = Path(value) if Path(value).is_absolute() else folder / value
        if not path.is_file():
            raise DataError(f"{where}: no such image file '{path}'")
        source: Any = path
        name = f"the image file '{path}'"
    elif isinstance(value, (bytes, bytearray)):
        source, name = io.BytesIO(value), f"its {len(value)} bytes"
    else:
        raise DataError(f"{where}: a {type(value).__name__}, not an image (a path, bytes, or a datasets Image feature)")
    try:
        with Image.open(source) as image:
            image.load()  # decode it all now: a truncated file fails here, not in a worker
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise DataError(f"{where}: {name} cannot be read as an image ({message})") from None


def image_part_count(messages: list[dict]) -> int:
    """How many `{"type": "image"}` content parts the messages hold."""
    return sum(
        1
        for message in messages
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if isinstance(part, dict) and part.get("type") == "image"
    )


def content_problem(content: Any) -> str | None:
    """Why a message's content is neither a string nor a list of text / image parts; None when it is."""
    if isinstance(content, str):
        return None
    if not isinstance(content, list):
        return f"content is a {type(content).__name__}, not a string or a list of parts"
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "image":
            continue
        if kind == "text" and isinstance(part.get("text"), str):
            continue
        return f"content part {j} is not {{'type': 'image'}} or {{'type': 'text', 'text': str}}: {str(part)[:80]}"
    return None


def check_image_parts(table: Table, row: int, key: str, messages: list[dict], images: int) -> None:
    """One image part per image of the row: never an image dropped or a placeholder left empty."""
    parts = image_part_count(messages)
    if parts != images:
        raise DataError(
            f"{table.where(row)}: key '{key}': the messages hold {parts} image part(s) "
            f"({{'type': 'image'}}) and the row has {images} image(s); give one part per image"
        )


def checked_image_row(table: Table, row: int, image_key: str, prompt_key: str) -> list["Image.Image"]:
    """One row's images decoded (row_images), its prompt chat messages with one image part per image."""
    images = row_images(table, row, image_key)
    messages = table.rows[row].get(prompt_key)
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise DataError(
            f"{table.where(row)}: key '{prompt_key}': a row with images needs its prompt as chat messages, "
            "with one {'type': 'image'} content part per image"
        )
    for j, message in enumerate(messages):
        if (problem := content_problem(message.get("content"))) is not None:
            raise DataError(f"{table.where(row)}: key '{prompt_key}': message {j}: {problem}")
    check_image_parts(table, row, prompt_key, messages, len(images))
    return images


def check_image_rows(table: Table, image_key: str, prompt_key: str) -> int:
    """Every row of one file (checked_image_row); returns the count of images. DataError naming file, row and
    key on the first bad row."""
    return sum(len(checked_image_row(table, row, image_key, prompt_key)) for row in range(len(table.rows)))


def check_image_files(data) -> None:
    """The image rows of data.train_files and data.eval_files (check_image_rows), read in the driver before
    Ray starts."""
    from roll_lite.data.files import read_table

    for config_key in ("data.train_files", "data.eval_files"):
        files = getattr(data, config_key.split(".")[1]) or []
        for path in [files] if isinstance(files, str) else files:
            check_image_rows(read_table(path, config_key), data.image_key, data.prompt_key)
