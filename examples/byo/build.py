"""Build everything the byo example trains on, locally, with nothing from a hub:

    OUT_DIR/data/{train,eval}.{jsonl,parquet}   arithmetic word problems (examples/byo/problems.py)
    OUT_DIR/base/                               a random-init Qwen2 + its byte-level BPE tokenizer
                                                (ChatML chat template) + generation_config

Run from the repository root:  python -m examples.byo.build outputs/byo
The same seed gives the same files and weights. The folder is built next to OUT_DIR and moved
into place at the end, so an interrupted build leaves nothing half-written.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from examples.byo.problems import word_problems

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# ChatML, as Qwen2 instruct models use it (without their default system message).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Qwen2's pre-tokenizer split (digits one by one), so that transformers' own Qwen2Tokenizer, which
# AutoTokenizer builds for every qwen2 folder from vocab + merges, encodes exactly as this tokenizer.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
MODEL_SIZES = {  # hidden, intermediate, layers, attention heads, KV heads
    "small": dict(
        hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2
    ),
    "tiny": dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1
    ),  # for tests
}
MAX_POSITIONS = 128  # a chat-templated prompt (~30 tokens) + a solution (~15) fit with room to spare


def build_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on `texts` (any text still encodes: all 256 bytes are in the vocabulary)."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=MAX_POSITIONS,
    )


def build_model(tokenizer: PreTrainedTokenizerFast, size: str, seed: int) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **MODEL_SIZES[size],
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def write_rows(rows: list[dict], stem: Path) -> None:
    """`stem`.jsonl and `stem`.parquet holding the same rows."""
    with stem.with_suffix(".jsonl").open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    pq.write_table(pa.Table.from_pylist(rows), stem.with_suffix(".parquet"))


def build(
    out_dir: Path,
    train_rows: int = 5000,
    eval_rows: int = 128,
    size: str = "small",
    vocab_size: int = 512,
    seed: int = 0,
) -> dict:
    """Writes the data, tokenizer and model into `out_dir` (which must not exist); returns a summary."""
    if size not in MODEL_SIZES:
        raise ValueError(f"size: '{size}' is not one of {', '.join(MODEL_SIZES)}")
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(
            f"vocab_size: must be >= {256 + len(SPECIAL_TOKENS)} (256 bytes + the special tokens), got {vocab_size}"
        )
    train, evaluation = word_problems(train_rows, eval_rows, seed)
    (out_dir / "data").mkdir(parents=True)
    write_rows(train, out_dir / "data" / "train")
    write_rows(evaluation, out_dir / "data" / "eval")

    # The tokenizer sees the training text and the chat template's role lines, never the eval rows.
    corpus = (
        [row["prompt"] for row in train] + [row["solution"] for row in train] + ["user\n", "assistant\n", "system\n"]
    )
    tokenizer = build_tokenizer(corpus, vocab_size)
    model = build_model(tokenizer, size, seed)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(out_dir / "base")
    tokenizer.save_pretrained(out_dir / "base")
    return {
        "train_rows": len(train),
        "eval_rows": len(evaluation),
        "vocab": len(tokenizer),
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.byo.build", description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path, help="folder to create (e.g. outputs/byo)")
    parser.add_argument("--train-rows", type=int, default=5000)
    parser.add_argument("--eval-rows", type=int, default=128)
    parser.add_argument("--size", choices=sorted(MODEL_SIZES), default="small")
    parser.add_argument("--vocab-size", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overwrite", action="store_true", help="replace OUT_DIR if it exists")
    args = parser.parse_args(argv)

    out_dir: Path = args.out_dir
    if out_dir.exists() and not args.overwrite:
        print(f"build: '{out_dir}' already exists; remove it or pass --overwrite", file=sys.stderr)
        return 2
    start = time.perf_counter()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        summary = build(staging / "out", args.train_rows, args.eval_rows, args.size, args.vocab_size, args.seed)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        (staging / "out").rename(out_dir)
    except ValueError as error:
        print(f"build: {error}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(
        f"built {out_dir}: {summary['train_rows']} train + {summary['eval_rows']} eval problems "
        f"(data/*.jsonl, *.parquet); base/: Qwen2 with {summary['parameters'] / 1e6:.2f} M parameters, "
        f"byte-level BPE with {summary['vocab']} tokens; {time.perf_counter() - start:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
