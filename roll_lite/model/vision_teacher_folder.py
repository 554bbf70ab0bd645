"""A distillation teacher's folder for a vision-language student (docs/vision.md, "Distillation teachers on image
prompts"): the teacher scores the student's ids, each image's tokens included, with the pixel_values the student's
processor made, so it must read both as the student does. `teacher_difference` says where a folder disagrees."""

from __future__ import annotations

import dataclasses
from typing import Any

# what the teacher reads of the student's pixel_values and ids: (its config's attribute path, the meaning)
CONFIG_FIELDS = (
    ("model_type", "model family"),
    ("image_token_id", "image token id"),
    ("video_token_id", "video token id"),
    ("vision_start_token_id", "vision start token id"),
    ("vision_end_token_id", "vision end token id"),
    ("vision_config.patch_size", "vision patch size"),
    ("vision_config.temporal_patch_size", "vision temporal patch size"),
    ("vision_config.spatial_merge_size", "vision merge size"),
    ("vision_config.in_channels", "vision input channels"),
    ("text_config.vocab_size", "vocabulary size (the LM head's rows)"),
)
PROCESSOR_FIELDS = ("patch_size", "temporal_patch_size", "merge_size", "image_mean", "image_std")


def _field(settings: Any, path: str) -> Any:
    for name in path.split("."):
        settings = getattr(settings, name, None)
    return settings


def teacher_model_config(model_config: Any, folder: str) -> Any:
    """The `model` keys of a teacher's workers (pipelines/teachers.py): the student's, with the teacher's folder."""
    return dataclasses.replace(model_config, pretrained_path=folder, tokenizer_path=folder)


def teacher_difference(model_config: Any, data_config: Any, folder: str) -> tuple[Any, str | None]:
    """(the teacher folder's tokenizer, the first way it reads the student's ids or pixels differently, or None):
    its config.json's vision token ids, patch / merge sizes and vocabulary size, then its processor's pixel
    settings, against the student's. ValueError (naming model.pretrained_path) for a folder that does not load."""
    from roll_lite.model.vision_run import model_processor, vision_config

    theirs = teacher_model_config(model_config, folder)
    student, teacher = vision_config(model_config), vision_config(theirs)
    for path, meaning in CONFIG_FIELDS:
        a, b = _field(student, path), _field(teacher, path)
        if a != b:
            return None, f"the {meaning} ({path} in config.json) is {a!r} for the student and {b!r} for the teacher"
    mine, other = model_processor(model_config, data_config), model_processor(theirs, data_config)
    for name in PROCESSOR_FIELDS:
        a, b = getattr(mine.image_processor, name, None), getattr(other.image_processor, name, None)
        if a != b:
            return other.tokenizer, (
                f"the image processor's {name} is {a!r} for the student and {b!r} for the teacher (the teacher reads "
                "the pixels the student's processor made)"
            )
    return other.tokenizer, None
