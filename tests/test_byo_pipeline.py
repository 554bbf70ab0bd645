"""examples/byo end to end at a tiny size through `roll-train`: the README's three commands verbatim
(build -> SFT -> GRPO with the math reward), with overrides appended that keep them small, run in a
directory that has the repo's examples/ (so outputs/ lands there); then the RL run's final/ (a BPE
tokenizer with a ChatML template) in plain transformers gives the run's own held-out answers."""

import json
import shlex
import subprocess
import sys
from pathlib import Path

import doc_commands
import warm_driver

REPO = Path(__file__).resolve().parents[1]
BUILD = "python -m examples.byo.build outputs/byo --overwrite"
SFT = "roll-train --config examples/byo/sft.yaml"
GRPO = "roll-train --config examples/byo/grpo.yaml"


def readme_command(line: str) -> list[str]:
    """`line` as argv, asserting the README shows it as a command of its own, and as the user's shell
    would run it: `python` and `roll-train` from this venv."""
    assert line in doc_commands.commands(line.split()[0]), f"README.md / docs no longer show `{line}`"
    argv = shlex.split(line)
    return [sys.executable, *argv[1:]] if argv[0] == "python" else [sys.executable, "-m", "roll_lite.cli", *argv[1:]]


def run(argv, cwd, timeout=300):
    result = warm_driver.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result


def metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_build_then_sft_then_grpo_with_the_math_reward(tmp_path):
    (tmp_path / "examples").symlink_to(REPO / "examples")
    assets, out = tmp_path / "outputs/byo", tmp_path / "outputs"
    run(readme_command(BUILD) + ["--size", "tiny", "--train-rows", "200", "--eval-rows", "8"], tmp_path)
    common = ["workers.torch_threads=1", "workers.backend=local"]  # one process, no Ray: the same run
    run(readme_command(SFT) + common + ["sft.steps=3", "sft.batch_size=8", "sft.eval_every=3"], tmp_path)
    sft = metrics(out / "byo_sft")
    assert [m["step"] for m in sft if "eval/sft_loss" in m] == [0, 3]
    assert sft[-1]["eval/sft_loss"] < sft[0]["eval/sft_loss"]  # 3 steps at lr 2e-3 already lower the held-out NLL
    final = out / "byo_sft" / "final"
    assert (final / "tokenizer.json").is_file() and (final / "model.safetensors").is_file()

    # GRPO starts from outputs/byo_sft/final (the config's own relative path) and reads outputs/byo/data.
    run(readme_command(GRPO) + common + ["steps=1", "rollout.prompts_per_step=2", "rollout.num_samples=2"], tmp_path)
    grpo = metrics(out / "byo_grpo")
    assert [m["step"] for m in grpo] == [0, 1]
    assert "reward/math" in grpo[1] and grpo[1]["reward/math/failed"] == 0
    samples = [
        json.loads(line) for line in (out / "byo_grpo" / "eval_samples" / "step_1.jsonl").read_text().splitlines()
    ]
    eval_rows = [json.loads(line) for line in (assets / "data/eval.jsonl").read_text().splitlines()]
    assert [s["answer"] for s in samples] == [r["answer"] for r in eval_rows]  # the eval ran on the held-out file

    # Plain transformers on final/: AutoTokenizer's chat template renders the prompt as the run did,
    # generation_config stops at <|im_end|>; the greedy answers equal the ones the run recorded.
    script = (
        "import json, sys\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "tok = AutoTokenizer.from_pretrained(sys.argv[1]); model = AutoModelForCausalLM.from_pretrained(sys.argv[1])\n"
        "for prompt in json.loads(sys.argv[2]):\n"
        "    ids = tok.apply_chat_template([{'role': 'user', 'content': prompt}], add_generation_prompt=True,\n"
        "                                  return_tensors='pt', return_dict=True)\n"
        "    out = model.generate(**ids, max_new_tokens=int(sys.argv[3]), do_sample=False)[0, ids['input_ids'].shape[1]:]\n"
        "    print(json.dumps(tok.decode(out, skip_special_tokens=True)))\n"
    )
    max_new_tokens = json.loads((out / "byo_grpo" / "config.yaml").read_text().split("max_new_tokens:")[1].split()[0])
    plain = subprocess.run(
        [
            sys.executable,
            "-c",
            script,
            str(out / "byo_grpo" / "final"),
            json.dumps([s["prompt"] for s in samples]),
            str(max_new_tokens),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert [json.loads(line) for line in plain.stdout.strip().splitlines()] == [s["response"] for s in samples]
