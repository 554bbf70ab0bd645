"""TRL's GRPOTrainer set up like roll_lite's GRPO run in benchmarks/vs_trl.py. Runs in TRL's own venv
(vs_trl.py makes it); imports nothing from roll_lite.

    python trl_grpo.py --model DIR --train train.jsonl --eval eval.jsonl --steps 200 [--threads 2]
                       [--eval-every N] [--reward-delay-s S]

One optimizer step = 2 prompts × 8 completions generated for it by the current policy (strictly
on-policy: one generation per step, one pass over it), at most 16 new tokens, temperature 1, no
top-k / top-p, lr 1e-4 constant, β = 0 (no reference model), token-mean loss (TRL's `dapo`), group
advantages (r - mean) / (std + eps), clip 0.2, grad-norm clip 1.0, float32, no gradient checkpointing.
The reward is roll_lite's `exact_answer`: 1 if the stripped response equals the answer; with
--reward-delay-s S scoring waits S seconds per response first (a slow judge), as roll_lite's
`benchmarks.slow_reward:exact_answer_slow` does. Held-out: greedy decoding
on the eval prompts before training, every --eval-every steps and after training, scored the same way,
each with the seconds since this process started (as roll_lite's perf/since_launch_s).

Prints one JSON line: per-step seconds (on_step_begin -> on_step_end: generation, reward, forward,
backward, optimizer) and their split (sampling; sampling with rewards and advantages; the rest trains), held-out reward before / after, the mean completion length, versions.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedTokenizerFast, TrainerCallback
from trl import GRPOConfig, GRPOTrainer


def read_jsonl(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


REWARD_DELAY_S = 0.0  # --reward-delay-s: a slow scorer's wait per response


def exact_answer(prompts, completions, answer, **kwargs) -> list[float]:
    if REWARD_DELAY_S:
        time.sleep(REWARD_DELAY_S * len(completions))
    return [float(c.strip() == str(a).strip()) for c, a in zip(completions, answer)]


def since_launch_s() -> float:
    """Seconds since this process started (Linux: its start time in /proc/self/stat, in clock ticks since boot)."""
    start_ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
    uptime_s = float(open("/proc/uptime").read().split()[0])
    return uptime_s - start_ticks / os.sysconf("SC_CLK_TCK")


def time_calls(obj, name: str, seconds: list) -> None:
    """Wrap obj.name so that each call appends its wall time to `seconds`."""
    method = getattr(obj, name)

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            seconds.append(time.perf_counter() - start)

    setattr(obj, name, timed)


class HeldOutEvery(TrainerCallback):
    """The held-out reward every `every` optimizer steps: (step, seconds since launch, reward)."""

    def __init__(self, every: int, tokenizer, rows: list[dict], max_new_tokens: int, evaluations: list):
        self.every, self.tokenizer, self.rows, self.max_new_tokens = every, tokenizer, rows, max_new_tokens
        self.evaluations = evaluations

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.every and state.global_step % self.every == 0 and state.global_step < args.max_steps:
            reward = held_out_reward(model, self.tokenizer, self.rows, self.max_new_tokens)
            self.evaluations.append((state.global_step, since_launch_s(), reward))


class StepTimer(TrainerCallback):
    def __init__(self):
        self.seconds, self._begin = [], None
        self.first_end_s = None  # seconds since launch at the first step's end (benchmarks/startup.py)

    def on_step_begin(self, args, state, control, **kwargs):
        self._begin = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.seconds.append(time.perf_counter() - self._begin)
        self.first_end_s = self.first_end_s or since_launch_s()


@torch.no_grad()
def held_out_reward(model, tokenizer, rows: list[dict], max_new_tokens: int) -> float:
    """Greedy, left-padded, BOS + prompt tokens (as roll_lite encodes a plain prompt)."""
    model.eval()
    saved, model.generation_config = (
        model.generation_config,
        GenerationConfig(
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        ),
    )
    prompts = tokenizer([r["prompt"] for r in rows])["input_ids"]  # the tokenizer's post-processor adds BOS
    width = max(map(len, prompts))
    input_ids = torch.full((len(prompts), width), tokenizer.pad_token_id)
    attention_mask = torch.zeros_like(input_ids)
    for i, ids in enumerate(prompts):
        input_ids[i, width - len(ids) :], attention_mask[i, width - len(ids) :] = torch.tensor(ids), 1
    out = model.generate(
        input_ids=input_ids, attention_mask=attention_mask, do_sample=False, max_new_tokens=max_new_tokens
    )
    texts = tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    model.generation_config = saved
    model.train()
    return statistics.mean(exact_answer(None, texts, [r["answer"] for r in rows]))


def main() -> None:
    imported_s = since_launch_s()  # the interpreter's start and the imports above
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--train", required=True)
    parser.add_argument("--eval", required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--eval-every", type=int, default=0, help="held-out evaluations between start and end")
    parser.add_argument("--reward-delay-s", type=float, default=0.0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    global REWARD_DELAY_S
    REWARD_DELAY_S = args.reward_delay_s

    # Not AutoTokenizer: for a qwen2 folder transformers 5 builds Qwen2Tokenizer, not the saved one.
    tokenizer = PreTrainedTokenizerFast.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    train = Dataset.from_list([{"prompt": r["prompt"], "answer": str(r["answer"])} for r in read_jsonl(args.train)])
    eval_rows = read_jsonl(args.eval)
    before = held_out_reward(model, tokenizer, eval_rows, args.max_new_tokens)
    evaluations = [(0, since_launch_s(), before)]

    completions = args.prompts * args.samples
    config = GRPOConfig(
        output_dir=args.output_dir,
        max_steps=args.steps,
        seed=args.seed,
        per_device_train_batch_size=completions,
        num_generations=args.samples,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=1,  # a fresh generation per optimizer step, used once
        max_completion_length=args.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        use_vllm=False,
        beta=0.0,
        loss_type="dapo",
        scale_rewards="group",
        epsilon=0.2,
        epsilon_high=0.2,
        mask_truncated_completions=False,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        optim="adamw_torch",
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        remove_unused_columns=False,  # the reward reads the `answer` column
        logging_steps=1,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )
    timer = StepTimer()  # first: the step's time leaves out the evaluation of HeldOutEvery
    held_out_every = HeldOutEvery(args.eval_every, tokenizer, eval_rows, args.max_new_tokens, evaluations)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=exact_answer,
        args=config,
        train_dataset=train,
        processing_class=tokenizer,
        callbacks=[timer, held_out_every],
    )
    # the step's split: sampling (_generate), then rewards, advantages and any old log-probs (the rest of
    # _generate_and_score_completions), then the loss's forward, backward and the optimizer (the rest)
    generate_s, prepare_s = [], []
    time_calls(trainer, "_generate", generate_s)
    time_calls(trainer, "_generate_and_score_completions", prepare_s)
    start = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - start
    after = held_out_reward(trainer.model, tokenizer, eval_rows, args.max_new_tokens)
    evaluations.append((args.steps, since_launch_s(), after))
    rewards = [log["reward"] for log in trainer.state.log_history if "reward" in log]
    lengths = [log["completions/mean_length"] for log in trainer.state.log_history if "completions/mean_length" in log]
    import trl

    print(
        json.dumps(
            {
                "step_s": timer.seconds,
                "generate_s": generate_s,
                "generate_and_score_s": prepare_s,
                "train_s": train_s,
                "held_out_before": before,
                "held_out_after": after,
                "evaluations": evaluations,
                "end_s": since_launch_s(),
                "imported_s": imported_s,
                "first_step_end_s": timer.first_end_s,
                "reward_mean": statistics.mean(rewards) if rewards else None,
                "response_length_mean": statistics.mean(lengths) if lengths else None,
                "trl": trl.__version__,
                "torch_threads": torch.get_num_threads(),
            }
        )
    )


if __name__ == "__main__":
    main()
