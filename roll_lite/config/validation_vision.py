"""Image keys (docs/vision.md): data.image_key, the resize bounds data.min_pixels / data.max_pixels and
model.freeze_vision. The images themselves are read and checked with the data, before Ray starts
(roll_lite/data/images.py); the pipelines then refuse data.image_key, as they do not train on images yet."""

from __future__ import annotations

from roll_lite.config.key_checks import check
from roll_lite.config.schema import RunConfig


def validate_vision(config: RunConfig) -> None:
    data = config.data
    if data.image_key is not None:
        check(bool(data.image_key), "data.image_key", "must name a column (null: no images)")
        check(data.source is None, "data.image_key", f"rows from data.source ({data.source}) hold no images")
    for key in ("min_pixels", "max_pixels"):
        value = getattr(data, key)
        if value is None:
            continue
        check(data.image_key is not None, f"data.{key}", "bounds the images of data.image_key, which is not set")
        check(value >= 1, f"data.{key}", f"must be >= 1 (pixels), got {value}")
    if data.min_pixels is not None and data.max_pixels is not None:
        check(
            data.min_pixels <= data.max_pixels,
            "data.min_pixels",
            f"{data.min_pixels} is over data.max_pixels={data.max_pixels}",
        )
    check(
        not config.model.freeze_vision,
        "model.freeze_vision",
        "needs a vision-language model, and no pipeline builds one yet (docs/vision.md)",
    )
