"""The run's tokenizer: a folder or hub id (`model.tokenizer_path`), or a character-level tokenizer
built locally (no hub): digits, letters, punctuation, space, newline.

Every tokenizer is loaded with `PreTrainedTokenizerFast.from_pretrained`, which runs the folder's
tokenizer.json exactly as saved (local folders and hub ids alike). `AutoTokenizer` may instead build
the model type's own class (transformers 5.x: `Qwen2Tokenizer` for every qwen2 folder, whatever
tokenizer_config.json says), which re-creates a byte-level BPE from the vocabulary and silently
changes a custom tokenizer's ids.

The character tokenizer is written as such a byte-level BPE without merges (space is 'Ġ', newline
'Ċ'), and adds <bos> itself (`add_bos_token`), so that plain `AutoTokenizer.from_pretrained` on a
saved run folder encodes text exactly as the run did, whichever class it picks.
"""

from __future__ import annotations

import string

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from roll_lite.model.files import first_line, locate

SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHARACTERS = string.digits + string.ascii_lowercase + string.ascii_uppercase + " =+-*/.,:;?!()<>[]{}#'\"_\n"


def _byte_level(character: str) -> str:
    """GPT-2's byte-to-unicode map (the symbols a ByteLevel pre-tokenizer emits) for one ASCII character."""
    kept = [*range(ord("!"), ord("~") + 1), *range(161, 173), *range(174, 256)]  # shown as themselves
    shifted = [b for b in range(256) if b not in kept]  # the others map to chr(256 + their index here)
    code = ord(character)
    return character if code in kept else chr(256 + shifted.index(code))


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character; ids: the special tokens, then CHARACTERS in order."""
    symbols = [_byte_level(c) for c in dict.fromkeys(CHARACTERS)]
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + symbols)}
    backend = Tokenizer(models.BPE(vocab, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        add_bos_token=True,
    )


def load_tokenizer(tokenizer_path: str | None, chat_template: str | None = None) -> PreTrainedTokenizerFast:
    """The run's tokenizer: a folder or hub id holding a tokenizer.json, or (None) the built-in
    character tokenizer. load_config fills `model.tokenizer_path` from `model.pretrained_path`.
    `chat_template` (model.chat_template): a named template or Jinja source replacing the tokenizer's."""
    tokenizer = _load(tokenizer_path)
    if chat_template is not None:
        from roll_lite.data.chat import chat_template_source

        tokenizer.chat_template = chat_template_source(chat_template)
    return tokenizer


def _load(tokenizer_path: str | None) -> PreTrainedTokenizerFast:
    if tokenizer_path is None:
        return build_char_tokenizer()
    where = locate(tokenizer_path, "model.tokenizer_path", "tokenizer")
    try:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_path)
    except (OSError, ValueError, TypeError) as error:
        raise ValueError(
            f"model.tokenizer_path: cannot load a tokenizer from the {where} '{tokenizer_path}': {first_line(error)}"
        ) from None
    for name in ("pad_token_id", "eos_token_id"):
        if getattr(tokenizer, name) is None:
            raise ValueError(
                f"model.tokenizer_path: the tokenizer in '{tokenizer_path}' has no {name.removesuffix('_id')} token"
            )
    return tokenizer
