"""The LM head's log-probs on a GPU, forward + backward, in bf16 compute: roll_lite.model.logprobs on the
bf16 operands (the tensor cores' matmul, float32 output) against the same call on float32 copies
(the float32 matmul it ran for bf16 models before), and both against float64.

    python benchmarks/head_speed.py                      # a GPU: 1.5b's head over mfu.py's step of tokens
    python benchmarks/head_speed.py --entropy            # forward also computes the entropy, as a train step does
    python benchmarks/head_speed.py --smoke              # tiny, on CPU (both paths then upcast)

The loss is Σ g_t log p(y_t) with g random (as advantages over a token count): the gradients it sends
back are those of a policy loss. Errors against float64 from the same bf16 values: the log-probs'
largest absolute error; the gradients' relative error ‖a − b‖ / ‖b‖ (hidden states and head).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run from a checkout without an install (the GPU machine)


def run(hidden, weight, targets, g, chunk: int, entropy: bool = False):
    from roll_lite.model.logprobs import chunked_log_probs

    hidden = hidden.detach().requires_grad_()
    weight = weight.detach().requires_grad_()
    log_probs, entropy_values = chunked_log_probs(hidden, weight, targets, chunk_size=chunk, with_entropy=entropy)
    (log_probs * g).sum().backward()
    entropy_values = entropy_values.detach().double() if entropy else None
    return log_probs.detach().double(), hidden.grad.double(), weight.grad.double(), entropy_values


def timed(fn, device, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize() if device.type == "cuda" else None
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize() if device.type == "cuda" else None
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=61782, help="mfu.py's step: 64 rows of up to 2048 tokens")
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--hidden", type=int, default=1536)
    parser.add_argument("--chunk", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--entropy", action="store_true", help="forward computes the entropy too (a metric)")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.tokens, args.vocab, args.hidden, args.chunk, args.repeats = 100, 300, 32, 16, 1
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    generator = torch.Generator(device=device).manual_seed(0)
    hidden = (torch.randn(args.tokens, args.hidden, device=device, generator=generator)).bfloat16()
    weight = (0.02 * torch.randn(args.vocab, args.hidden, device=device, generator=generator)).bfloat16()
    targets = torch.randint(0, args.vocab, (args.tokens,), device=device, generator=generator)
    g = torch.randn(args.tokens, device=device, generator=generator) / args.tokens

    paths = {
        "bf16 operands": lambda: run(hidden, weight, targets, g, args.chunk, args.entropy),
        "float32 copies": lambda: run(hidden.float(), weight.float(), targets, g, args.chunk, args.entropy),
    }
    reference = run(hidden.double(), weight.double(), targets, g, args.chunk, args.entropy)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(
        f"{name}; torch {torch.__version__}; {args.tokens:,} tokens, vocabulary {args.vocab:,}, hidden "
        f"{args.hidden}, chunks of {args.chunk}; entropy {'computed' if args.entropy else 'not computed'}; TF32 matmuls {torch.backends.cuda.matmul.allow_tf32}\n"
    )
    print(
        "| head matmuls | forward + backward s | TFLOP/s | log p max abs error | hidden grad rel. error | "
        "head grad rel. error | entropy max abs error |\n|---|---|---|---|---|---|---|"
    )
    flops = 8 * args.tokens * args.vocab * args.hidden  # forward, backward's recomputation, two gradients
    seconds = {}
    for label, fn in paths.items():
        result = fn()  # the first call: allocator and kernel choice
        seconds[label] = timed(fn, device, args.repeats)
        errors = [float((result[0] - reference[0]).abs().max())] + [
            float((got - want).norm() / want.norm()) for got, want in zip(result[1:3], reference[1:3])
        ]
        entropy_error = f"{float((result[3] - reference[3]).abs().max()):.2e}" if args.entropy else "-"
        print(
            f"| {label} | {seconds[label]:.3f} | {flops / seconds[label] / 1e12:.0f} | {errors[0]:.2e} | "
            f"{errors[1]:.2e} | {errors[2]:.2e} | {entropy_error} |",
            flush=True,
        )
    print(f"\nfloat32 copies / bf16 operands: {seconds['float32 copies'] / seconds['bf16 operands']:.2f}×")


if __name__ == "__main__":
    main()
