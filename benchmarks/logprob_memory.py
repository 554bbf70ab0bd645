"""Peak memory and time of the LM head's log-probs (+ entropy), forward + backward: full logits
(log_softmax over [tokens, vocab], autograd) against roll_lite.model.logprobs.chunked_log_probs.

    python benchmarks/logprob_memory.py [--tokens 2048 --chunk 256 --vocab 151936 --hidden 896]
    python benchmarks/logprob_memory.py --smoke     # a tiny size, seconds (tests/test_benchmark_scripts.py)

Each measurement runs in a fresh process (--smoke: forked from this one, benchmarks/forked.py): its
peak resident memory (VmHWM, reset after the inputs are built) minus the resident memory before the
step, i.e. what the step adds. Three uses of the head, as training asks for them: log-probs only;
log-probs with the entropy as a metric (computed, not in the loss: the PPO loss without an entropy
bonus); and the entropy in the loss. The defaults keep tokens / chunk = 8 as in 8192 tokens at the
default chunk of 1024, at a size the full-logits reference fits in on a 24 GiB machine (Qwen2.5-0.5B's
vocabulary and hidden size).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from forked import run_forked

CASES = (("log-probs", False, False), ("log-probs + entropy metric", True, False), ("entropy in the loss", True, True))


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def measure(
    method: str,
    tokens: int,
    chunk: int,
    vocab: int,
    hidden_size: int,
    with_entropy: bool,
    entropy_loss: bool,
    repeats: int,
) -> dict:
    """In this process: (peak added bytes, median seconds) of one forward + backward."""
    import torch

    from roll_lite.model.logprobs import chunked_log_probs

    torch.manual_seed(0)
    hidden = (torch.randn(tokens, hidden_size) * 0.5).requires_grad_()
    weight = (torch.randn(vocab, hidden_size) * 0.02).requires_grad_()
    targets = torch.randint(0, vocab, (tokens,))

    def step():
        if method == "chunked":
            log_probs, entropy = chunked_log_probs(hidden, weight, targets, chunk_size=chunk, with_entropy=with_entropy)
        else:
            log_softmax = torch.log_softmax(hidden @ weight.T, dim=-1)
            log_probs = log_softmax.gather(-1, targets[:, None]).squeeze(-1)
            entropy = -(log_softmax.exp() * log_softmax).sum(-1) if with_entropy else None
        loss = -log_probs.mean()
        if entropy_loss:
            loss = loss - 0.01 * entropy.mean()
        elif with_entropy:
            entropy.detach().mean().item()  # the metric
        loss.backward()
        hidden.grad = weight.grad = None

    Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to the current resident size
    before = _status("VmRSS")
    step()
    peak = _status("VmHWM") - before
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return {"peak": peak, "seconds": statistics.median(times)}


def _ratio(value: float, reference: float) -> float:
    return value / reference if reference else float("nan")  # a tiny size may add no resident memory at all


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="64 tokens, vocab 2000, hidden 32, chunk 16, 1 repeat")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: one measurement, JSON on stdout
    args = parser.parse_args()
    if args.smoke:
        args.tokens, args.chunk, args.vocab, args.hidden, args.repeats = 64, 16, 2000, 32, 1
        import roll_lite.model.logprobs  # noqa: F401  (imported once here, for every fork)
    if args.one:
        method, case = args.one.split(":")
        _, with_entropy, entropy_loss = CASES[int(case)]
        print(
            json.dumps(
                measure(
                    method, args.tokens, args.chunk, args.vocab, args.hidden, with_entropy, entropy_loss, args.repeats
                )
            )
        )
        return
    print(
        f"{args.tokens} tokens, vocab {args.vocab}, hidden {args.hidden}, chunk {args.chunk}, float32, "
        f"median of {args.repeats} forward + backward"
    )
    print(
        "| head use | full logits: peak added | chunked: peak added | memory ratio | full s | chunked s | time ratio |"
    )
    print("|---|---|---|---|---|---|---|")
    for index, (name, with_entropy, entropy_loss) in enumerate(CASES):
        results = {}
        for method in ("full", "chunked"):
            if args.smoke:  # its imports done: ~2 CPU s less a measurement, its peak a few MiB off a new process's
                case = (args.tokens, args.chunk, args.vocab, args.hidden, with_entropy, entropy_loss, args.repeats)
                results[method] = run_forked(measure, method, *case)
                if "failed" in results[method]:
                    raise SystemExit(f"{name}, {method}: {results[method]['failed']}")
                continue
            command = [
                sys.executable,
                __file__,
                f"--one={method}:{index}",
                f"--tokens={args.tokens}",
                f"--chunk={args.chunk}",
                f"--vocab={args.vocab}",
                f"--hidden={args.hidden}",
                f"--repeats={args.repeats}",
            ]
            output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
            results[method] = json.loads(output.strip().splitlines()[-1])
        full, chunked = results["full"], results["chunked"]
        print(
            f"| {name} | {full['peak'] / 2**30:.2f} GiB | {chunked['peak'] / 2**30:.2f} GiB | "
            f"{_ratio(chunked['peak'], full['peak']):.3f} | {full['seconds']:.2f} | {chunked['seconds']:.2f} | "
            f"{_ratio(chunked['seconds'], full['seconds']):.2f} |"
        )


if __name__ == "__main__":
    main()
