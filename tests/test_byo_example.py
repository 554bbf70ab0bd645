"""examples/byo: the assets build.py writes (tiny size), checked with plain transformers, pyarrow and
math-verify; and configs/grpo_gsm8k.yaml loads through the config validation."""

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedTokenizerFast

from examples.byo.build import build, main
from examples.byo.problems import word_problems
from roll_lite.config import load_config
from roll_lite.rewards.math_verify_reward import math_answer

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    out = tmp_path_factory.mktemp("byo") / "assets"
    build(out, train_rows=300, eval_rows=20, size="tiny", seed=3)
    return out


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_the_tokenizer_round_trips_and_renders_chatml_ending_with_the_generation_prompt(assets):
    tokenizer = PreTrainedTokenizerFast.from_pretrained(assets / "base")
    for text in ["Tom has 13 pens. 13 - 5 = 8. The answer is \\boxed{8}.", "unseen: héllo, wörld! 123\n"]:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == text
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "How many?"}]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert rendered == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHow many?<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert ids[-3:] == tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")  # special tokens are single ids
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.bos_token is None


def test_auto_tokenizer_on_the_folder_encodes_exactly_as_the_saved_tokenizer(assets):
    # transformers 5.x builds its own Qwen2Tokenizer for a qwen2 folder; build.py uses Qwen2's split so they agree
    ours = PreTrainedTokenizerFast.from_pretrained(assets / "base")
    auto = AutoTokenizer.from_pretrained(assets / "base")
    rows = read_jsonl(assets / "data" / "eval.jsonl")
    for text in [r["prompt"] for r in rows] + [r["solution"] for r in rows] + ["héllo 12345 \\boxed{17}.\n"]:
        assert auto(text, add_special_tokens=False)["input_ids"] == ours(text, add_special_tokens=False)["input_ids"]
    messages = [{"role": "user", "content": rows[0]["prompt"]}]
    assert auto.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    ) == ours.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert (auto.eos_token_id, auto.pad_token_id) == (ours.eos_token_id, ours.pad_token_id)


def test_the_model_loads_with_the_tokenizers_vocabulary_and_eos_pad_ids(assets):
    tokenizer = PreTrainedTokenizerFast.from_pretrained(assets / "base")
    model = AutoModelForCausalLM.from_pretrained(assets / "base")
    assert model.config.model_type == "qwen2" and model.config.vocab_size == len(tokenizer)
    assert model.get_input_embeddings().weight.shape[0] == len(tokenizer)
    generation = GenerationConfig.from_pretrained(assets / "base")
    assert generation.eos_token_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert generation.pad_token_id == tokenizer.pad_token_id == tokenizer.convert_tokens_to_ids("<|endoftext|>")
    longest = max(
        len(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": r["prompt"]}], add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )
        + len(tokenizer(r["solution"], add_special_tokens=False)["input_ids"])
        + 1
        for r in read_jsonl(assets / "data" / "train.jsonl")
    )
    assert longest <= model.config.max_position_embeddings
    with torch.no_grad():
        logits = model(torch.tensor([[1, 5, 7]])).logits
    assert logits.shape == (1, 3, len(tokenizer)) and torch.isfinite(logits).all()


def test_jsonl_and_parquet_hold_the_same_rows_and_eval_is_held_out(assets):
    data = assets / "data"
    for split, rows in (("train", 300), ("eval", 20)):
        jsonl = read_jsonl(data / f"{split}.jsonl")
        assert len(jsonl) == rows
        assert pq.read_table(data / f"{split}.parquet").to_pylist() == jsonl
    train = {r["prompt"] for r in read_jsonl(data / "train.jsonl")}
    evaluation = [r["prompt"] for r in read_jsonl(data / "eval.jsonl")]
    assert len(set(evaluation)) == len(evaluation) and not train & set(evaluation)


def test_every_solution_boxes_the_answer_and_the_math_reward_scores_it_1():
    train, evaluation = word_problems(200, 50, seed=1)
    for row in train + evaluation:
        a, op, b = re.match(r"(\d+) ([+-]) (\d+) = ", row["solution"]).groups()
        numbers = [int(n) for n in re.findall(r"\d+", row["prompt"])]
        assert numbers == [int(a), int(b)]  # the solution works with the question's numbers
        assert str(int(a) + int(b) if op == "+" else int(a) - int(b)) == row["answer"]
        assert row["solution"].endswith(f"\\boxed{{{row['answer']}}}.") and int(row["answer"]) >= 1
    for row in (train + evaluation)[:40]:  # math-verify is ~3 ms a call
        assert math_answer(row["solution"], row["answer"]) == 1.0
        assert math_answer(row["solution"].replace("boxed{", "boxed{1"), row["answer"]) == 0.0


def test_the_same_seed_builds_the_same_files_and_weights(tmp_path, assets):
    build(tmp_path / "again", train_rows=300, eval_rows=20, size="tiny", seed=3)
    for name in ("data/train.jsonl", "data/eval.parquet", "base/tokenizer.json", "base/model.safetensors"):
        assert (tmp_path / "again" / name).read_bytes() == (assets / name).read_bytes(), name


def test_the_command_refuses_an_existing_folder_and_bad_sizes(tmp_path, capsys):
    (tmp_path / "taken").mkdir()
    assert main([str(tmp_path / "taken")]) == 2
    assert "already exists; remove it or pass --overwrite" in capsys.readouterr().err
    assert main([str(tmp_path / "new"), "--vocab-size", "100"]) == 2
    assert "vocab_size: must be >= 259" in capsys.readouterr().err
    assert main([str(tmp_path / "new"), "--eval-rows", "0"]) == 2
    assert "need at least one train and one eval row" in capsys.readouterr().err
    assert not (tmp_path / "new").exists() and [p.name for p in tmp_path.iterdir()] == ["taken"]  # nothing left behind


def test_the_gsm8k_config_passes_validation():
    config = load_config(REPO / "configs/grpo_gsm8k.yaml")
    assert config.model.pretrained_path == config.model.tokenizer_path == "Qwen/Qwen2.5-0.5B-Instruct"
    assert config.reward.functions == {"math": 1.0} and config.algorithm.advantage == "grpo"
    assert config.data.answer_key == "reward_model.ground_truth" and config.rollout.num_samples == 8


def test_the_gsm8k_configs_home_relative_data_paths_are_read(tmp_path, monkeypatch):
    """configs/grpo_gsm8k.yaml names ~/data/gsm8k/*.parquet (where verl's preprocessing writes them):
    `~` is the home folder in every path key, as in a shell (the distillation teachers' too), and the
    files are read from there."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from roll_lite.data.files import read_table

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "data" / "gsm8k").mkdir(parents=True)
    row = {"prompt": [{"role": "user", "content": "1 + 1?"}], "reward_model": {"style": "rule", "ground_truth": "2"}}
    for name in ("train", "test"):
        pq.write_table(pa.Table.from_pylist([row]), tmp_path / "data" / "gsm8k" / f"{name}.parquet")
    config = load_config(REPO / "configs/grpo_gsm8k.yaml", ["output_dir=~/runs"])
    assert config.data.train_files == [str(tmp_path / "data/gsm8k/train.parquet")]
    assert config.data.eval_files == [str(tmp_path / "data/gsm8k/test.parquet")]
    assert config.output_dir == str(tmp_path / "runs") and config.model.pretrained_path == "Qwen/Qwen2.5-0.5B-Instruct"
    for key in ("data.train_files", "data.eval_files"):
        table = read_table(getattr(config.data, key.split(".")[1])[0], key)
        assert table.rows[0]["reward_model"]["ground_truth"] == "2", key
    assert load_config(None, ["distill.teacher=~/teacher"]).distill.teacher == str(tmp_path / "teacher")
    teachers = load_config(None, ["distill.teachers={math: ~/teachers/math, code: ./code}"]).distill.teachers
    assert teachers == {"math": str(tmp_path / "teachers/math"), "code": "./code"}


def test_the_gpu_configs_ask_for_gpus_and_bf16_mixed_precision():
    """configs/grpo_gpu.yaml ran on an H100 (README); here only its settings can be checked."""
    for name in ("grpo_gpu.yaml", "grpo_gsm8k.yaml"):
        config = load_config(REPO / "configs" / name)
        assert config.workers.gpus_per_rank == 1, name
        assert (config.model.dtype, config.actor.param_dtype) == ("float32", "bfloat16"), name


def test_the_export_of_a_model_with_the_bpe_tokenizer_names_its_special_ids(assets, tmp_path, monkeypatch):
    from test_model import _worker, assert_special_ids_exported

    # A model built from the config's model.* keys (its config has no special ids) with the BPE tokenizer.
    config = load_config(
        None,
        [
            f"model.tokenizer_path={assets / 'base'}",
            "model.hidden_size=32",
            "model.intermediate_size=64",
            "model.num_hidden_layers=1",
        ],
    )
    actor = _worker("actor", config, monkeypatch)
    actor.save_pretrained(str(tmp_path / "final"))
    tokenizer = PreTrainedTokenizerFast.from_pretrained(assets / "base")
    assert tokenizer.bos_token_id is None  # Qwen-style: no bos, so config.json says null for it
    assert_special_ids_exported(tmp_path / "final", tokenizer)
