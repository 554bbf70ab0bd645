"""examples/byo end to end at a tiny size through `roll-train`: build -> SFT (a few steps) -> GRPO (1 step)
with the math reward, from the repository root with absolute paths, as README's commands run; then
the RL run's final/ (a BPE tokenizer with a ChatML template) in plain transformers gives the run's own
held-out answers."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(*args, timeout=300):
    result = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result


def metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_build_then_sft_then_grpo_with_the_math_reward(tmp_path):
    assets, out = tmp_path / "byo", tmp_path / "runs"
    run("-m", "examples.byo.build", str(assets), "--size", "tiny", "--train-rows", "200", "--eval-rows", "8")
    common = [f"output_dir={out}", "workers.torch_threads=1"]
    run("-m", "roll_lite.cli", "--config", "examples/byo/sft.yaml", *common, f"model.pretrained_path={assets / 'base'}",
        f"sft.train_files={assets / 'data/train.jsonl'}", f"sft.eval_files={assets / 'data/eval.parquet'}",
        "sft.steps=3", "sft.batch_size=8", "sft.eval_every=3")
    sft = metrics(out / "byo_sft")
    assert [m["step"] for m in sft if "eval/sft_loss" in m] == [0, 3]
    assert sft[-1]["eval/sft_loss"] < sft[0]["eval/sft_loss"]  # 3 steps at lr 2e-3 already lower the held-out NLL
    final = out / "byo_sft" / "final"
    assert (final / "tokenizer.json").is_file() and (final / "model.safetensors").is_file()

    run("-m", "roll_lite.cli", "--config", "examples/byo/grpo.yaml", *common, f"model.pretrained_path={final}",
        f"data.train_files={assets / 'data/train.parquet'}", f"data.eval_files={assets / 'data/eval.jsonl'}",
        "steps=1", "rollout.prompts_per_step=2", "rollout.num_samples=2")
    grpo = metrics(out / "byo_grpo")
    assert [m["step"] for m in grpo] == [0, 1]
    assert "reward/math" in grpo[1] and grpo[1]["reward/math/failed"] == 0
    samples = [json.loads(line) for line in (out / "byo_grpo" / "eval_samples" / "step_1.jsonl").read_text().splitlines()]
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
    plain = subprocess.run([sys.executable, "-c", script, str(out / "byo_grpo" / "final"),
                            json.dumps([s["prompt"] for s in samples]), str(max_new_tokens)],
                           capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert [json.loads(line) for line in plain.stdout.strip().splitlines()] == [s["response"] for s in samples]
