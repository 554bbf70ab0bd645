"""Where a model or tokenizer comes from: a local folder (saved with save_pretrained) or a hub id.

`locate(path, key, needs)` says which, or raises ValueError with one line naming the config key: a
missing folder (a string that is not of the hub form `name` / `org/name`, or that looks like a local
path) is reported as such (transformers would call it a malformed repo id), with the command that
writes it when a shipped config's run does (roll_lite/runtime/shipped_runs.py), and so is a folder
without the files a model (config.json + weights) or a tokenizer (tokenizer.json) needs. Only a hub
id goes to the network (when transformers loads it).
"""

from __future__ import annotations

from pathlib import Path

from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

from roll_lite.runtime.shipped_runs import written_by

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def is_hub_id(text: str) -> bool:
    try:
        validate_repo_id(text)
    except HFValidationError:
        return False
    return True


def locate(path: str, key: str, needs: str) -> str:
    """'folder' or 'hub' for `path` (the value of config key `key`); `needs` is 'model' or 'tokenizer'."""
    folder = Path(path).expanduser()
    if folder.is_dir():
        if needs == "model":
            if not (folder / "config.json").is_file():
                raise ValueError(
                    f"{key}: '{path}' is a folder but not a model: it has no config.json (write one with "
                    "save_pretrained)"
                )
            if not any((folder / name).is_file() for name in WEIGHT_FILES):
                raise ValueError(f"{key}: '{path}' has a config.json but no weights ({', '.join(WEIGHT_FILES)})")
        elif not (folder / "tokenizer.json").is_file():
            raise ValueError(
                f"{key}: '{path}' has no tokenizer.json (a fast tokenizer saved with save_pretrained); "
                "set model.tokenizer_path to a folder or hub id that has one"
            )
        return "folder"
    if folder.exists():
        raise ValueError(f"{key}: '{path}' is a file; give the {needs} folder (or a hub id org/name)")
    if looks_local(path) or not is_hub_id(path):
        raise ValueError(f"{key}: no such folder '{path}' (and not a hub id of the form org/name){written_by(path)}")
    return "hub"


def looks_local(path: str) -> bool:
    """A path the user meant as a folder here: absolute, ./ ../ ~, or under an existing directory
    ('outputs/run/final' when outputs/ exists). Anything else of the form name or org/name is a hub id."""
    first = Path(path).parts[0] if Path(path).parts else ""
    return path.startswith(("/", ".", "~")) or (len(Path(path).parts) > 1 and Path(first).is_dir())


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def local_model(path: str, key: str, what: str, auto_class: str, kind: str):
    """(HF config, tokenizer) of a local model folder whose architecture is an `auto_class` one
    (AutoModelForCausalLM, AutoModelForSequenceClassification); `what` ('a judge') and `kind` ('a
    generative one') name it in errors: one line naming `key` when it is not there or not that kind."""
    from transformers import AutoConfig, AutoTokenizer

    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ValueError(
            f"{key}: no such folder '{path}' ({what} is a local folder saved with save_pretrained){written_by(path)}"
        )
    for needed in ("config.json", "tokenizer.json"):
        if not (folder / needed).is_file():
            raise ValueError(f"{key}: '{path}' has no {needed} (save the model and its tokenizer with save_pretrained)")
    config = AutoConfig.from_pretrained(folder)
    architectures = getattr(config, "architectures", None) or []
    suffix = auto_class.removeprefix("AutoModel")
    if not any(name.endswith(suffix) for name in architectures):
        raise ValueError(
            f"{key}: '{path}' is a {', '.join(architectures) or config.model_type} model, not {kind} ({auto_class})"
        )
    return config, AutoTokenizer.from_pretrained(folder)
