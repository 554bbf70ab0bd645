"""The top-k forward KL's cost against k, in the LM head where it lives (roll_lite.model.logprobs):

- the student: forward + backward of chunked_log_probs on [N, 1 + k] targets (the sampled token and the
  teacher's k ids, one chunked pass), against k = 0 (the sampled token alone, what every RL step pays);
- the teacher: chunked_top_k, its k most likely next tokens (no grad), against chunked_log_probs
  without grad (what a reference or a teacher pays for the sampled token alone).

    python benchmarks/distill_top_k.py            # N=4096 tokens, hidden 896, vocab 32768 (CPU: a few minutes)
    python benchmarks/distill_top_k.py --smoke    # tiny

Prints the median of a few repeats per k, and each as a multiple of k = 0.
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
    sys.path.insert(0, str(REPO))


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None) -> None:
    from roll_lite.model.logprobs import chunked_log_probs, chunked_top_k

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    tokens, hidden_size, vocab, ks = args.tokens, args.hidden, args.vocab, (0, 1, 4, 16, 64)
    if args.smoke:
        tokens, hidden_size, vocab, ks, args.repeats = 64, 16, 128, (0, 4), 1
    torch.manual_seed(0)
    hidden = torch.randn(tokens, hidden_size)
    weight = torch.randn(vocab, hidden_size) / hidden_size**0.5
    sampled = torch.randint(0, vocab, (tokens,))

    def student(k: int):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        targets = sampled if k == 0 else torch.cat([sampled[:, None], torch.randint(0, vocab, (tokens, k))], dim=1)
        log_probs, _ = chunked_log_probs(h, w, targets, chunk_size=1024)
        log_probs.sum().backward()

    def teacher(k: int):
        with torch.no_grad():
            if k == 0:
                chunked_log_probs(hidden, weight, sampled, chunk_size=1024)
            else:
                chunked_top_k(hidden, weight, k, chunk_size=1024)

    rows = [
        (k, median_seconds(lambda: student(k), args.repeats), median_seconds(lambda: teacher(k), args.repeats))
        for k in ks
    ]
    print(f"tokens {tokens}, hidden {hidden_size}, vocab {vocab}, {torch.get_num_threads()} threads")
    print("| k | student fwd+bwd | × k=0 | teacher pass | × k=0 |\n|---:|---:|---:|---:|---:|")
    for k, s, t in rows:
        print(f"| {k} | {s * 1000:.1f} ms | {s / rows[0][1]:.2f} | {t * 1000:.1f} ms | {t / rows[0][2]:.2f} |")


if __name__ == "__main__":
    main()
