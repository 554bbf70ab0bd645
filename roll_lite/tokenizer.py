"""A character-level tokenizer built locally (no hub): digits, letters, punctuation, space.

It is a real `PreTrainedTokenizerFast`, so the rest of the code treats it like any HF tokenizer,
and it saves to / loads from a folder. Load a saved one with `PreTrainedTokenizerFast.from_pretrained`
(AutoTokenizer may swap in the model type's own tokenizer class).
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHARACTERS = string.digits + string.ascii_lowercase + string.ascii_uppercase + " =+-*/.,:;?!()<>[]{}#'\"_\n"


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + list(dict.fromkeys(CHARACTERS)))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )


def load_tokenizer(tokenizer_path: str | None) -> PreTrainedTokenizerFast:
    """The run's tokenizer: a local folder saved with save_pretrained, or the built-in character
    tokenizer. Loaded with PreTrainedTokenizerFast, not AutoTokenizer, which may replace a custom
    tokenizer with the model type's own class."""
    if tokenizer_path is None:
        return build_char_tokenizer()
    try:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_path)
    except (OSError, ValueError) as error:
        raise ValueError(f"model.tokenizer_path: cannot load a tokenizer from '{tokenizer_path}': {error}") from None
    for name in ("pad_token_id", "eos_token_id"):
        if getattr(tokenizer, name) is None:
            raise ValueError(f"model.tokenizer_path: the tokenizer in '{tokenizer_path}' has no {name.removesuffix('_id')} token")
    return tokenizer
