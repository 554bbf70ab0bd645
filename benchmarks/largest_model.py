"""The largest Qwen2-shaped model whose GRPO train step runs on this device, and its step time.

    python benchmarks/largest_model.py                  # a GPU: the ladder below, bf16, checkpointing
    python benchmarks/largest_model.py --smoke          # CPU: a tiny ladder under a 100 MiB cap, one thread (tests)
    python benchmarks/largest_model.py --estimate-only  # the memory estimate of each rung, no run

The step is benchmarks/mfu.py's (FSDP2Strategy on one rank, float32 weights and AdamW, bf16 compute
on a GPU, packed micro-batches of --budget tokens, the PPO policy loss on GRPO-like rows, the chunked
log-probs head) with activation checkpointing (variant ac, or --variant). The ladder: Qwen2.5-like
shapes (head dim 64 below hidden 1024, else 128; 2-8 kv heads, MLP ≈ 5.4 × hidden, vocabulary 151,936, tied head) of growing
width and depth, sorted by parameters. Bisection over it, assuming a larger model never needs less
memory: each probe is a process of its own that runs the first step and --steps more; a rung fits
when that finishes without running out of memory and its peak (mfu.py's) is under the cap
(--cap-gib; default the GPU's memory). workers.offload does not enter: it moves the weights and
AdamW state off the GPU between calls, not during the train step.

The estimate (a formula, not a measurement): bytes ≈ 16·N (float32 weights and gradients, AdamW's two
moments) + 2·V·d (the root's bf16 copy of embedding and head during the step) + 4·N_layer (two layers'
bf16 copies: the one computing and the one prefetched) + T·(2·L·d + 2·(12·d + 4·f)) (bf16
activations under checkpointing: each layer's input, and one layer recomputed in full) + 8·c·V (the
head's chunk of logits, float32, and its gradient), for N parameters, L layers, hidden d, MLP f,
vocabulary V, T tokens per micro-batch and c = logprob_chunk_size (1024).
"""

from __future__ import annotations

import argparse

from mfu import VARIANTS, VOCAB_QWEN, run_child

SMOKE_SHAPES = [(64, 2), (256, 2), (384, 4)]  # hidden, layers; vocabulary 512
LADDER = [
    (896, 24),
    (1536, 28),
    (2048, 36),
    (2560, 36),
    (3072, 36),
    (3584, 28),
    (3584, 36),
    (4096, 36),
    (4096, 48),
    (5120, 48),
]


def qwen2_shape(hidden: int, layers: int, vocab: int = VOCAB_QWEN) -> dict:
    heads = max(2, hidden // (64 if hidden < 1024 else 128))
    kv_heads = 2 if heads <= 16 else 4 if heads <= 32 else 8
    while heads % kv_heads:
        kv_heads //= 2
    return dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=round(5.375 * hidden / 256) * 256 or 128,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        tie_word_embeddings=True,
    )


def parameter_count(shape: dict) -> tuple[int, int]:
    """(all parameters, one decoder layer's) of the shape, by the same formula as HF's Qwen2."""
    d, f, heads, kv = (
        shape[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads")
    )
    kv_dim = kv * d // heads
    layer = d * d + d + 2 * (d * kv_dim + kv_dim) + d * d + 3 * d * f + 2 * d  # q (bias), k, v (bias), o, MLP, 2 norms
    return shape["vocab_size"] * d + shape["num_hidden_layers"] * layer + d, layer


def estimate_bytes(shape: dict, tokens: int, chunk: int = 1024) -> float:
    """The module docstring's formula."""
    n, n_layer = parameter_count(shape)
    d, f, layers, vocab = (shape[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size"))
    return 16 * n + 2 * vocab * d + 4 * n_layer + tokens * (2 * layers * d + 2 * (12 * d + 4 * f)) + 8 * chunk * vocab


def search(shapes: list[dict], probe) -> tuple[int | None, dict]:
    """Bisection: (index of the largest shape that fits or None, {index: probe result})."""
    low, high, results = -1, len(shapes), {}  # shapes[low] fits, shapes[high] does not (or is past the end)
    while high - low > 1:
        middle = (low + high) // 2
        results[middle] = probe(shapes[middle])
        if results[middle]["fits"]:
            low = middle
        else:
            high = middle
    return (low if low >= 0 else None), results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="ac", choices=list(VARIANTS))
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--budget", type=int, default=16384, help="tokens per packed micro-batch")
    parser.add_argument("--steps", type=int, default=2, help="steps after the first (the step time is their median)")
    parser.add_argument("--cap-gib", type=float, default=None, help="memory cap; default: the GPU's memory")
    parser.add_argument("--shapes", default=None, help="HIDDENxLAYERS,... instead of the ladder")
    parser.add_argument("--estimate-only", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="a tiny ladder on CPU under a 100 MiB cap, one thread")
    args = parser.parse_args()
    import torch

    vocab = 512 if args.smoke else VOCAB_QWEN
    pairs = SMOKE_SHAPES if args.smoke else LADDER
    if args.shapes:
        try:
            pairs = [tuple(int(x) for x in item.split("x")) for item in args.shapes.split(",")]
        except ValueError:
            parser.error(f"--shapes: expected HIDDENxLAYERS,..., got {args.shapes!r}")
    if args.smoke:
        args.rows, args.seq_len, args.budget, args.steps, args.cap_gib = 8, 64, 128, 1, args.cap_gib or 100 / 1024
    shapes = sorted((qwen2_shape(h, n, vocab) for h, n in pairs), key=lambda s: parameter_count(s)[0])
    cuda = torch.cuda.is_available()
    cap = args.cap_gib or (torch.cuda.get_device_properties(0).total_memory / 2**30 if cuda else None)
    if cap is None and not args.estimate_only:
        parser.error("--cap-gib: no GPU here, give the memory cap")
    dtype = "bfloat16" if cuda else "float32"
    print(
        f"{torch.cuda.get_device_name() if cuda else 'cpu'}; cap {f'{cap:.2f} GiB' if cap else 'none'}; variant {args.variant}, {dtype} "
        f"compute; {args.rows} rows of up to {args.seq_len} tokens, micro-batches of ≤ {args.budget} tokens\n"
    )

    def probe(shape: dict) -> dict:
        spec = dict(
            model=shape,
            variant=args.variant,
            rows=args.rows,
            seq_len=args.seq_len,
            budget=args.budget,
            steps=args.steps,
            dtype=dtype,
            threads=1 if args.smoke else None,
        )
        result = run_child(spec, fork=args.smoke)
        if "failed" in result:  # not out of memory: a broken probe says nothing about the size
            raise SystemExit(f"hidden {shape['hidden_size']}, {shape['num_hidden_layers']} layers: {result['failed']}")
        result["fits"] = "peak_bytes" in result and result["peak_bytes"] <= cap * 2**30
        return result

    if args.estimate_only:
        found, results = None, {}
    else:
        found, results = search(shapes, probe)
    print(
        "| hidden | layers | heads / kv | MLP | params | estimate GiB | probed: peak GiB | fits | step s | tokens/s |"
    )
    print("|" + "---|" * 10)
    for index, shape in enumerate(shapes):
        result = results.get(index, {})
        peak = (
            f"{result['peak_bytes'] / 2**30:.2f}"
            if "peak_bytes" in result
            else result.get("oom") and "out of memory" or result.get("failed") or "-"
        )
        timing = (
            f"{result['step_s']:.2f} | {result['tokens'] / result['step_s']:,.0f}" if "step_s" in result else "- | -"
        )
        fits = ("yes" if result["fits"] else "no") if result else "-"
        print(
            f"| {shape['hidden_size']} | {shape['num_hidden_layers']} | {shape['num_attention_heads']} / "
            f"{shape['num_key_value_heads']} | {shape['intermediate_size']} | {parameter_count(shape)[0] / 1e9:.3f} B | "
            f"{estimate_bytes(shape, args.budget) / 2**30:.2f} | {peak} | {fits} | {timing} |"
        )
    if not args.estimate_only:
        largest = shapes[found] if found is not None else None
        print(
            "\nlargest that fits: "
            + (
                f"hidden {largest['hidden_size']}, {largest['num_hidden_layers']} layers, "
                f"{parameter_count(largest)[0] / 1e9:.3f} B parameters"
                if largest
                else "none"
            )
        )


if __name__ == "__main__":
    main()
