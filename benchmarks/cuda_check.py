"""The CUDA paths, checked and timed on one GPU (CI has none; run this where one is lent):

    python benchmarks/cuda_check.py            # on a CUDA machine
    python benchmarks/cuda_check.py --smoke    # tiny sizes, any device: checks the script itself

1. varlen kernels: every packed-attention path that can run (flash-attn, torch-varlen,
   per-sequence sdpa) against float64 attention of each sequence alone, forward and backward;
2. packed vs padded log-probs of Qwen2 and Llama models in bfloat16, both against float64;
3. the FSDP2 strategy on one nccl rank: a step's loss and gradients vs one float64
   forward/backward of the global batch, for 3 policy losses and the critic's value loss × 4 agg modes, in float32 and in bfloat16
   mixed precision (float32 master weights and gradient reduction);
4. train-step throughput and peak memory of a 201 M-parameter Qwen2 in bf16, per path;
5. offload (workers.offload): what moving the shards and AdamW state to CPU frees, what it costs,
   and that training after offload / onload follows the same trajectory as without.

    python benchmarks/cuda_check.py --sections offload   # one section (kernels, log_probs, strategy, speed, offload)
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from attention_paths import KERNELS, force_path, runnable_paths  # noqa: E402  (the script's folder is on sys.path)
from distributed_harness import case_batch, deviations, reference  # noqa: E402
from loss_cases import BUDGET, CRITIC_LOSSES, MASK_KEYS, make_loss, value_head_weights  # noqa: E402
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict  # noqa: E402
from torch.distributed.fsdp import FSDPModule  # noqa: E402

import roll_lite.model.attention as attention  # noqa: E402
from roll_lite.loss import AGG_MODES, ppo_policy_loss_func  # noqa: E402
from roll_lite.loss.checker import TINY_MODEL, random_rl_batch  # noqa: E402
from roll_lite.model.modeling import CausalLMWithLogProbs, build_causal_lm  # noqa: E402
from roll_lite.strategy import FSDP2Strategy, StrategyConfig  # noqa: E402
from roll_lite.strategy.micro_batches import forward_micro_batch  # noqa: E402


def table(header: list[str], rows: list[list]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(f"{x:.1e}" if isinstance(x, float) else str(x) for x in row) + " |")
    print(flush=True)


def check_kernels(device: torch.device, lengths: list[int]) -> None:
    """Each path's output and input gradients vs float64 attention of each sequence alone."""
    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, dim, total = 8, 2, 64, sum(lengths)
    base = [torch.randn(1, h, total, dim, generator=gen) for h in (heads, kv_heads, kv_heads)]
    grad_out = torch.randn(1, total, heads, dim, generator=gen)
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    scale = dim**-0.5

    def run(kernel, dtype, on):
        q, k, v = (t.to(on, dtype).requires_grad_() for t in base)
        out = kernel(q, k, v, cu.to(on), max(lengths), scale)
        out.backward(grad_out.to(on, dtype))
        return [t.detach().double().cpu() for t in (out, q.grad, k.grad, v.grad)]

    exact = run(KERNELS["per-sequence-sdpa"], torch.float64, torch.device("cpu"))
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        for path in runnable_paths(device, dtype):
            got = run(KERNELS[path], dtype, device)
            errors = [float((g - e).abs().max() / e.abs().max()) for g, e in zip(got, exact)]
            rows.append([path, str(dtype).removeprefix("torch."), *errors])
    print(f"## varlen kernels vs float64 per-sequence attention (lengths {lengths}, 8 q / 2 kv heads, dim 64)")
    print("max |error| / max |exact|\n")
    table(["path", "dtype", "output", "dq", "dk", "dv"], rows)


def check_packed_vs_padded(device: torch.device, num_rows: int, seq_len: int) -> None:
    """bf16 log-probs, packed (auto path) and padded (sdpa), each vs the float64 model on CPU."""
    models = {
        "qwen2": dict(
            TINY_MODEL,
            vocab_size=512,
            hidden_size=256,
            intermediate_size=512,
            num_attention_heads=8,
            num_key_value_heads=2,
            num_hidden_layers=4,
            max_position_embeddings=seq_len,
        ),
        "llama": dict(
            TINY_MODEL,
            model_type="llama",
            vocab_size=512,
            hidden_size=256,
            intermediate_size=512,
            num_attention_heads=8,
            num_key_value_heads=8,
            num_hidden_layers=4,
            max_position_embeddings=seq_len,
        ),
    }
    data = random_rl_batch(num_rows=num_rows, seq_len=seq_len, vocab_size=512, seed=4)
    valid = data["attention_mask"].bool()
    valid[:, 0] = False
    rows = []
    for name, model_config in models.items():
        lm = build_causal_lm(model_config, dtype=torch.float64, seed=0)
        with torch.no_grad():
            exact = forward_micro_batch(CausalLMWithLogProbs(lm), data, StrategyConfig(), with_entropy=False)[
                "log_probs"
            ]
        model = CausalLMWithLogProbs(lm.to(device, torch.bfloat16))
        results = {}
        with torch.no_grad():
            for packing in (False, True):
                out = forward_micro_batch(
                    model, data.to(device), StrategyConfig(use_packing=packing), with_entropy=False
                )
                results[packing] = out["log_probs"].double().cpu()
        path = attention.packed_attention_path(device, torch.bfloat16)[0]
        err = lambda a, b: float((a - b)[valid].abs().max())  # noqa: E731
        rows.append(
            [name, path, err(results[True], exact), err(results[False], exact), err(results[True], results[False])]
        )
    print(f"## bf16 log-probs, packed vs padded ({num_rows} rows up to {seq_len} tokens), max |error| in nats\n")
    table(["model", "packed path", "packed vs fp64", "padded vs fp64", "packed vs padded"], rows)


def check_strategy_exactness(device: torch.device) -> None:
    """One nccl rank (world size 1): step loss and gradients vs one float64 global forward/backward."""
    references = {(loss, mode): reference(loss, mode, torch.float32) for loss in MASK_KEYS for mode in AGG_MODES}
    rows = []
    for param_dtype in ("float32", "bfloat16"):
        for micro_batching in ("A2-padded", "budget-packed"):
            worst = {}
            config = StrategyConfig(
                grad_accum_steps=2 if micro_batching == "A2-padded" else 1,
                use_packing=micro_batching == "budget-packed",
                max_tokens_per_micro_batch=BUDGET if micro_batching == "budget-packed" else None,
                lr=0.0,  # the weights stay as built, so one strategy per head serves every case
                max_grad_norm=None,
                param_dtype=param_dtype,
            )
            strategies = {critic: _one_rank_strategy(config, critic, device) for critic in (False, True)}
            for loss_name in MASK_KEYS:
                for mode in AGG_MODES:
                    critic = loss_name in CRITIC_LOSSES
                    strategy = strategies[critic]
                    data = case_batch(loss_name, torch.float32, rows=7)
                    data.meta_info["loss_mask_keys"] = MASK_KEYS[loss_name]
                    metrics = strategy.train_step(data, make_loss(loss_name, mode))
                    grads = {
                        n.removeprefix("lm."): p.grad.full_tensor().double().cpu()
                        for n, p in strategy.model.named_parameters()
                        if p.grad is not None
                    }
                    ref_loss, ref_grads = references[(loss_name, mode)]
                    loss_err, grad_err = deviations((metrics["loss"], grads, None), (ref_loss, ref_grads))
                    loss_abs_err = abs(metrics["loss"] - ref_loss)
                    key = ("critic" if critic else "actor", mode)
                    previous = worst.get(key, (0.0, 0.0, 0.0))
                    worst[key] = tuple(max(a, b) for a, b in zip(previous, (loss_err, loss_abs_err, grad_err)))
            backend = torch.distributed.get_backend()
            for (model, mode), errors in worst.items():
                rows.append([param_dtype, micro_batching, model, mode, backend, *errors])
    print(
        "## FSDP2 strategy on one rank vs one float64 forward/backward (actor: worst over the 3 policy losses; "
        "critic: the value loss)"
    )
    print("(the KL loss under seq-mean-token-mean is -3e-4, a near-cancelling sum: read its absolute error)\n")
    table(
        [
            "compute dtype",
            "micro-batches",
            "model",
            "agg mode",
            "backend",
            "loss rel. err",
            "loss abs. err",
            "grad rel. err",
        ],
        rows,
    )


def _one_rank_strategy(config: StrategyConfig, critic: bool, device: torch.device) -> FSDP2Strategy:
    # shard_single_rank: on one GPU in float32 the strategy would train the bare model
    strategy = FSDP2Strategy(
        build_causal_lm(TINY_MODEL, dtype=torch.float32, seed=0),
        config,
        head="value" if critic else "log_probs",
        device=device,
        shard_single_rank=True,
    )
    if critic:
        set_model_state_dict(
            strategy.model,
            value_head_weights(torch.float32),
            options=StateDictOptions(full_state_dict=True, strict=False),
        )
    return strategy


def time_train_steps(device: torch.device, smoke: bool) -> None:
    if smoke:
        model_config = dict(TINY_MODEL, vocab_size=512, max_position_embeddings=256)
        num_rows, seq_len, budget, steps = 8, 64, 256, 2
    else:
        model_config = dict(
            model_type="qwen2",
            vocab_size=32000,
            hidden_size=1024,
            intermediate_size=2816,
            num_hidden_layers=12,
            num_attention_heads=16,
            num_key_value_heads=4,
            max_position_embeddings=2048,
            tie_word_embeddings=False,
        )
        num_rows, seq_len, budget, steps = 64, 2048, 16384, 5
    data = random_rl_batch(
        num_rows=num_rows, seq_len=seq_len, vocab_size=model_config["vocab_size"], seed=1, dtype=torch.float32
    )
    tokens = int(data["attention_mask"].sum())
    settings = [("padded", None, dict(grad_accum_steps=8))]
    settings += [
        (f"packed, {p}", p, dict(use_packing=True, max_tokens_per_micro_batch=budget))
        for p in runnable_paths(device, torch.bfloat16)
    ]
    rows = []
    for label, path, micro_batching in settings:
        force_path(path)
        config = StrategyConfig(param_dtype="bfloat16", lr=1e-5, **micro_batching)
        lm = build_causal_lm(model_config, dtype=torch.float32, seed=0)
        num_params = sum(p.numel() for p in lm.parameters())
        strategy = FSDP2Strategy(lm, config, device=device)
        loss_func = ppo_policy_loss_func("token-mean")
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(steps + 2):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            metrics = strategy.train_step(data, loss_func)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        median = sorted(times[2:])[len(times[2:]) // 2]
        peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
        rows.append(
            [label, int(metrics["num_micro_batches"]), f"{median:.3f}", f"{tokens / median:,.0f}", f"{peak:.1f}"]
        )
        del strategy
        if device.type == "cuda":
            torch.cuda.empty_cache()
    force_path(None)
    print(
        f"## bf16 train step, Qwen2 {num_params / 1e6:.0f} M params, {num_rows} rows, {tokens} real tokens "
        f"(padded to {num_rows * seq_len}), median of {steps} steps after 2 warm-ups\n"
    )
    table(["micro-batching", "micro-batches", "s/step", "real tokens/s", "peak GiB"], rows)


def check_offload(device: torch.device, smoke: bool) -> None:
    if device.type != "cuda":
        print("## offload: nothing to move on CPU (FSDP2Strategy.offload is a no-op there)\n")
        return
    model_config = dict(
        model_type="qwen2",
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=12,
        num_attention_heads=16,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )
    data = random_rl_batch(num_rows=16, seq_len=512, vocab_size=32000, seed=2, dtype=torch.float32)
    config = StrategyConfig(param_dtype="bfloat16", lr=1e-4, use_packing=True, max_tokens_per_micro_batch=4096)
    runs = {}
    for offload in (False, True):
        strategy = FSDP2Strategy(build_causal_lm(model_config, dtype=torch.float32, seed=0), config, device=device)
        norms, moves = [], []
        for _ in range(3):
            norms.append(strategy.train_step(data, ppo_policy_loss_func("token-mean"))["grad_norm"])
            if offload:
                torch.cuda.synchronize()
                before, start = torch.cuda.memory_allocated(device), time.perf_counter()
                strategy.offload()
                after, offloaded = torch.cuda.memory_allocated(device), time.perf_counter()
                strategy.onload()
                torch.cuda.synchronize()
                moves.append((before / 2**30, after / 2**30, offloaded - start, time.perf_counter() - offloaded))
        log_probs = strategy.compute_log_probs(data)["log_probs"]
        for module in strategy.model.modules():  # a no-grad forward leaves the root unsharded: plain tensors
            if isinstance(module, FSDPModule):
                module.reshard()
        params = {n: p.full_tensor().float().cpu() for n, p in strategy.model.named_parameters()}
        runs[offload] = (norms, log_probs, params, moves)
        del strategy
        torch.cuda.empty_cache()
    (norms, log_probs, params, _), (o_norms, o_log_probs, o_params, moves) = runs[False], runs[True]
    param_diff = max(float((params[n] - o_params[n]).abs().max()) for n in params)
    before, after, out_s, in_s = (sum(m[i] for m in moves) / len(moves) for i in range(4))
    print("## offload / onload between steps (201 M-param Qwen2, float32 master weights + AdamW), 3 steps\n")
    table(
        [
            "allocated before offload GiB",
            "after GiB",
            "offload s",
            "onload s",
            "grad norms, without / with",
            "max |Δ param| after 3 steps",
            "max |Δ log-prob|",
        ],
        [
            [
                f"{before:.2f}",
                f"{after:.2f}",
                f"{out_s:.3f}",
                f"{in_s:.3f}",
                " ".join(f"{a:.6g}/{b:.6g}" for a, b in zip(norms, o_norms)),
                param_diff,
                float((log_probs - o_log_probs).abs().max()),
            ]
        ],
    )


SECTIONS = ("kernels", "log_probs", "strategy", "speed", "offload")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes; runs on CPU too")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {', '.join(SECTIONS)}")
    args = parser.parse_args()
    sections = args.sections.split(",")
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"--sections: unknown {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 rows compare float32 arithmetic
        torch.backends.cudnn.allow_tf32 = False
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(
        f"torch {torch.__version__}, transformers {importlib.metadata.version('transformers')}, device {name}; "
        f"flash-attn installed: {attention.flash_attn_available()}, torch varlen: {attention.torch_varlen_available()}"
    )
    for dtype in (torch.bfloat16, torch.float32):
        path, why = attention.packed_attention_path(device, dtype)
        print(f"packed attention for {str(dtype).removeprefix('torch.')}: {path} ({why})")
    print()
    if "kernels" in sections:
        check_kernels(device, [1, 7, 64, 300] if args.smoke else [1, 7, 64, 300, 1000, 2048])
    if "log_probs" in sections:
        check_packed_vs_padded(device, num_rows=6 if args.smoke else 16, seq_len=32 if args.smoke else 512)
    if "strategy" in sections:
        check_strategy_exactness(device)
    if "speed" in sections:
        time_train_steps(device, args.smoke)
    if "offload" in sections:
        check_offload(device, args.smoke)


if __name__ == "__main__":
    main()
