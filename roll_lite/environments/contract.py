"""The environment contract (gymnasium / GEM style) and the checks of what an environment returns.

An environment is a class built with keyword arguments (the config's `kwargs`) and has

    reset(seed=None, **row_fields) -> (observation, info)
    step(action: str) -> (observation, reward, terminated, truncated, info)

- observation: the text the model sees next, a str, or a list of chat messages, each a dict with
  str "role" and a "content" (other keys, e.g. "name", are kept). A content is a str, or (for a
  vision-language policy) a list of parts, {"type": "text", "text": str} and {"type": "image", "image":
  a PIL image, an image file's bytes or its path}; an observation may also be such a list of parts itself
  (one message). Each image is decoded here, in the environment's process (`checked_parts`): one that
  cannot be read is a BadImage, which ends that trajectory as "bad_image" (images.py: the driver's side);
- reward: a finite real number (a bool counts as 0 / 1) for this step;
- terminated: bool, the task reached an end state (solved, or failed for good);
- truncated: bool, the episode was cut (a turn limit) without reaching an end state;
- info: a dict of diagnostics, never shown to the model.

What reset and step return crosses a process boundary (the runner's), so it must pickle.

`reset` is called with `seed` and the dataset row's fields; the fields its signature does not name
are not passed (all of them are when it takes **kwargs). A step after the episode ended is the
caller's error. Anything else returned is a BadReturn, which ends that trajectory as "bad_return".
"""

from __future__ import annotations

import inspect
import io
import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union, cast

import numpy as np

Message = dict  # {"role": str, "content": str or a list of parts, ...}
Observation = Union[str, list[Message]]


class BadReturn(Exception):
    """What reset or step returned breaks the contract; the message says how."""


class BadImage(BadReturn):
    """An image of the observation cannot be read (checked_parts) or encoded (images.py), or the policy reads no
    images: the fault "bad_image"."""


@dataclass(frozen=True)
class Transition:
    """One checked step."""

    observation: Observation
    reward: float
    terminated: bool
    truncated: bool
    info: dict = field(default_factory=dict)


def checked_reset(value) -> tuple[Observation, dict]:
    _check_tuple(value, 2, "reset", "(observation, info)")
    observation, info = value
    return checked_observation(observation, "reset"), _checked_info(info, "reset")


def checked_step(value) -> Transition:
    if isinstance(value, tuple) and len(value) == 4:
        raise BadReturn(
            "step returned 4 values (the old gym API: observation, reward, done, info); the contract is "
            "(observation, reward, terminated, truncated, info)"
        )
    _check_tuple(value, 5, "step", "(observation, reward, terminated, truncated, info)")
    observation, reward, terminated, truncated, info = value
    return Transition(
        checked_observation(observation, "step"),
        _checked_reward(reward),
        _checked_flag(terminated, "terminated"),
        _checked_flag(truncated, "truncated"),
        _checked_info(info, "step"),
    )


def checked_observation(observation, where: str) -> Observation:
    if isinstance(observation, str):
        return observation
    if is_parts(observation):  # one message's content parts
        observation = [{"role": "user", "content": observation}]
    if not isinstance(observation, list) or not observation:
        raise BadReturn(
            f"{where}'s observation is {_describe(observation)}, not a str or a non-empty list of chat messages"
        )
    messages = []
    for index, message in enumerate(observation):
        if not isinstance(message, dict):
            raise BadReturn(f"{where}'s observation[{index}] is {_describe(message)}, not a dict (role, content)")
        if not isinstance(message.get("role"), str):
            raise BadReturn(f"{where}'s observation[{index}]['role'] is {_describe(message.get('role'))}, not a str")
        content = message.get("content")
        if not isinstance(content, (str, list)):
            raise BadReturn(
                f"{where}'s observation[{index}]['content'] is {_describe(content)}, not a str or a list of parts"
            )
        if not message["role"]:
            raise BadReturn(f"{where}'s observation[{index}] has an empty role")
        if isinstance(content, list):  # text and image parts: BadImage for an image that cannot be read
            content = checked_parts(content, f"{where}'s observation[{index}]['content']")
        messages.append({**message, "content": content})
    return messages


def checked_parts(parts: list, where: str) -> list[dict]:
    """A content's parts, each text or image, every image decoded to RGB (BadImage when one cannot be)."""
    checked = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            checked.append(dict(part))
        elif kind == "image":
            if "image" not in part:
                raise BadImage(f"{where}: part {j} is an image part without its 'image' (a PIL image, bytes or a path)")
            checked.append({**part, "image": decoded_image(part["image"], f"{where}: part {j}")})
        else:
            raise BadImage(
                f"{where}: part {j} is not {{'type': 'text', 'text': str}} or {{'type': 'image', 'image': ...}}: "
                f"{str(part)[:80]}"
            )
    return checked


def decoded_image(value: Any, where: str):
    """`value` (a PIL image, an image file's bytes, or its path) decoded whole, as an RGB PIL image."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(value, Image.Image):
        source: Any = value
        name = f"the {value.mode} image"
    elif isinstance(value, (bytes, bytearray)):
        source, name = io.BytesIO(value), f"its {len(value)} bytes"
    elif isinstance(value, (str, Path)):
        if not Path(value).is_file():
            raise BadImage(f"{where}: no such image file '{value}'")
        source, name = Path(value), f"the image file '{value}'"
    else:
        raise BadImage(f"{where}: a {type(value).__name__}, not an image (a PIL image, bytes or a path)")
    try:
        if isinstance(source, Image.Image):
            source.load()
            image = source.convert("RGB")
        else:
            with Image.open(source) as opened:
                opened.load()  # all of it now: a truncated file fails here, in the environment's process
                image = opened.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise BadImage(f"{where}: {name} cannot be read as an image ({message})") from None
    if min(image.size) < 1:
        raise BadImage(f"{where}: {name} is empty ({image.size[0]} x {image.size[1]} pixels)")
    return image


def is_parts(observation: Any) -> bool:
    """A list of content parts (each a dict with a 'type' and no 'role'), not a list of chat messages."""
    return (
        isinstance(observation, list)
        and bool(observation)
        and all(isinstance(item, dict) and "type" in item and "role" not in item for item in observation)
    )


def reset_parameters(environment_class) -> frozenset[str] | None:
    """The row fields `reset` takes by name; None when it takes **kwargs (every field)."""
    parameters = inspect.signature(environment_class.reset).parameters.values()
    if any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters):
        return None
    names = {
        parameter.name
        for parameter in parameters
        if parameter.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    return frozenset(names - {"self", "seed"})


def check_environment_class(environment_class, spec: str) -> None:
    """The class side of the contract, checked before anything is built; TypeError naming `spec`."""
    if not inspect.isclass(environment_class):
        raise TypeError(f"'{spec}' is a {type(environment_class).__name__}, not a class")
    for method in ("reset", "step"):
        if not callable(getattr(environment_class, method, None)):
            raise TypeError(
                f"'{spec}' has no {method}() method; an environment needs reset(seed=None, **row_fields) "
                "and step(action)"
            )
    # cast: typeshed's inspect.isclass narrows to type[object], which has no reset
    parameters = inspect.signature(cast(Any, environment_class).reset).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    if "seed" not in parameters and not takes_any:
        raise TypeError(
            f"'{spec}'.reset{inspect.signature(cast(Any, environment_class).reset)} takes no seed; the contract is "
            "reset(seed=None, **row_fields)"
        )


def _check_tuple(value, arity: int, where: str, shape: str) -> None:
    if not isinstance(value, (tuple, list)):
        raise BadReturn(f"{where} returned {_describe(value)}, not a tuple {shape}")
    if len(value) != arity:
        raise BadReturn(f"{where} returned {len(value)} values, not {arity} {shape}")


def _checked_reward(reward) -> float:
    if isinstance(reward, (bool, np.bool_)):
        return float(reward)
    if not isinstance(reward, numbers.Real):
        raise BadReturn(f"step's reward is {_describe(reward)}, not a number")
    value = float(reward)
    if not math.isfinite(value):
        raise BadReturn(f"step's reward is {value}")
    return value


def _checked_flag(flag, name: str) -> bool:
    if not isinstance(flag, (bool, np.bool_)):
        raise BadReturn(
            f"step's {name} is {_describe(flag)}, not a bool (the order is observation, reward, "
            "terminated, truncated, info)"
        )
    return bool(flag)


def _checked_info(info, where: str) -> dict:
    if not isinstance(info, dict):
        raise BadReturn(f"{where}'s info is {_describe(info)}, not a dict")
    return info


def _describe(value) -> str:
    text = repr(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    return f"a {type(value).__name__} ({text})"
