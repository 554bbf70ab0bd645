"""The SFT pipeline end to end (`roll-train --config configs/sft.yaml`), an RL run starting from its
final/ folder, and that folder's RL successor generating with plain transformers exactly the held-out
answers the run recorded (eval_samples/)."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_hidden_layers=2", "model.num_attention_heads=2",
        "model.num_key_value_heads=1", "workers.torch_threads=1"]


def roll_train(*args, cwd=REPO):
    result = subprocess.run([sys.executable, "-m", "roll_lite.cli", *args], capture_output=True, text=True, timeout=600, cwd=cwd)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_sft_then_rl_from_its_final_folder_and_plain_transformers_reproduce_the_answers(tmp_path):
    eval8 = tmp_path / "eval8.jsonl"
    eval8.write_text("".join((REPO / "data/reverse_digits/eval.jsonl").read_text().splitlines(keepends=True)[:8]))
    train = REPO / "data/reverse_digits/train.jsonl"
    result = roll_train("--config", str(REPO / "configs/sft.yaml"), *TINY, "sft.steps=4", "sft.eval_every=2",
                        "sft.batch_size=16", f"sft.train_files={train}", f"sft.eval_files={eval8}",
                        f"output_dir={tmp_path}", "run_name=sft")
    history = records(tmp_path / "sft")
    assert [r["step"] for r in history] == [0, 1, 2, 3, 4]
    eval_losses = [r.get("eval/sft_loss") for r in history]
    assert None not in (eval_losses[0], eval_losses[2], eval_losses[4]) and eval_losses[1] is None
    assert eval_losses[4] < eval_losses[0]  # 4 steps at lr 2e-3 on the answers
    assert all(r["sft/target_tokens"] > 16 for r in history[1:])  # every row's answer + <eos>
    assert "sft step 4/4" in result.stderr
    final = tmp_path / "sft" / "final"
    assert (final / "model.safetensors").is_file() and (final / "tokenizer.json").is_file()

    # GRPO starts from the SFT folder (model and tokenizer), no warm start.
    roll_train("--config", str(REPO / "configs/grpo.yaml"), f"model.pretrained_path={final}", "sft.steps=0",
               "workers.torch_threads=1", "steps=1", "rollout.prompts_per_step=2", "rollout.num_samples=2",
               f"data.train_files={train}", f"data.eval_files={eval8}", f"output_dir={tmp_path}", "run_name=rl")
    samples = [json.loads(line) for line in (tmp_path / "rl" / "eval_samples" / "step_1.jsonl").read_text().splitlines()]
    assert [s["prompt"] for s in samples] == [json.loads(line)["prompt"] for line in eval8.read_text().splitlines()]
    assert sum(s["score"] for s in samples) / 8 == records(tmp_path / "rl")[-1]["eval/reward_mean"]

    # Plain transformers on the RL run's final/: AutoTokenizer adds the BOS the run's prompts had,
    # generation_config carries eos / pad; greedy answers equal the run's recorded ones.
    script = (
        "import json, sys\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "tok = AutoTokenizer.from_pretrained(sys.argv[1]); model = AutoModelForCausalLM.from_pretrained(sys.argv[1])\n"
        "for prompt in json.loads(sys.argv[2]):\n"
        "    ids = tok(prompt, return_tensors='pt')\n"
        "    out = model.generate(**ids, max_new_tokens=10, do_sample=False)[0, ids['input_ids'].shape[1]:]\n"
        "    print(json.dumps(tok.decode(out, skip_special_tokens=True)))\n"
    )
    plain = subprocess.run([sys.executable, "-c", script, str(tmp_path / "rl" / "final"),
                            json.dumps([s["prompt"] for s in samples])], capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert [json.loads(line) for line in plain.stdout.strip().splitlines()] == [s["response"] for s in samples]
