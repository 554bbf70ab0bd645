"""The exact packed attention on CPU (per-sequence sdpa on one packed row) against the same sequences
as separate tensors, forward + backward, as the number of sequences in the pack grows.

    python benchmarks/packed_attention.py [--tokens 4096 --heads 4 --kv-heads 2 --dim 32 --repeats 5]

The pack holds `--tokens` tokens split into n equal sequences. Three ways, same inputs, same result:
separate (each sequence its own leaf tensors: the floor), packed (roll_lite.model.attention's path, which
splits the packed row), and packed by slicing (how it was done before: each slice's backward builds a
zero gradient of the whole row). Prints the median seconds and the ratio to separate.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from roll_lite.model.attention import _per_sequence_sdpa


def _sliced(query, key, value, cu_seqlens):
    bounds = cu_seqlens.tolist()
    outputs = [
        F.scaled_dot_product_attention(
            query[:, :, a:b],
            key[:, :, a:b],
            value[:, :, a:b],
            is_causal=True,
            enable_gqa=query.shape[1] != key.shape[1],
        )
        for a, b in zip(bounds[:-1], bounds[1:])
    ]
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous()


def _separate(parts):
    return [
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])
        for q, k, v in parts
    ]


def timed(step, repeats: int) -> float:
    step()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sequences", type=int, nargs="+", default=[4, 16, 64, 256])
    args = parser.parse_args()
    torch.manual_seed(0)
    print(
        f"{args.tokens} tokens per pack, {args.heads} query / {args.kv_heads} kv heads of {args.dim}, float32, "
        f"{torch.get_num_threads()} threads; forward + backward, median of {args.repeats}\n"
    )
    print("| sequences | separate s | packed s (split) | ratio | packed s (slicing, before) | ratio | max |Δ grad| |")
    print("|---|---|---|---|---|---|---|")
    for n in args.sequences:
        length = args.tokens // n
        shapes = [(1, h, n * length, args.dim) for h in (args.heads, args.kv_heads, args.kv_heads)]
        q, k, v = (torch.randn(shape, requires_grad=True) for shape in shapes)
        cu_seqlens = torch.arange(0, n * length + 1, length)
        parts = [
            [t.detach()[:, :, i * length : (i + 1) * length].clone().requires_grad_() for t in (q, k, v)]
            for i in range(n)
        ]

        def separate():
            torch.cat(_separate(parts), dim=2).sum().backward()

        def packed(attend):
            def step():
                q.grad = k.grad = v.grad = None
                attend(q, k, v, cu_seqlens).sum().backward()

            return step

        t_separate = timed(separate, args.repeats)
        t_split = timed(packed(lambda *a: _per_sequence_sdpa(*a, None, 0.0)), args.repeats)
        split_grad = q.grad.clone()
        t_sliced = timed(packed(_sliced), args.repeats)
        diff = (split_grad - q.grad).abs().max().item()
        print(
            f"| {n} | {t_separate:.4f} | {t_split:.4f} | {t_split / t_separate:.2f} | {t_sliced:.4f} | "
            f"{t_sliced / t_separate:.2f} | {diff:.1e} |"
        )


if __name__ == "__main__":
    main()
