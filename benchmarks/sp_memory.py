"""Peak memory per rank and step time of one training step against sequence length, at sequence-parallel
degrees S = 1, 2, 4 (Ulysses, roll_lite/strategy/sequence_parallel.py; docs/sequence-parallel.md).

    python benchmarks/sp_memory.py [--lengths 2048,8192,32768 --degrees 1,2,4 --hidden 512 --layers 8]

For each (S, length): S gloo ranks on this machine's CPU (one data-parallel group, D = 1), each an FSDP2Strategy
at sequence_parallel=S training one sequence of `length` tokens (packed) with the SFT loss (forward, backward, AdamW), with
activation checkpointing unless --no-checkpointing. Two peaks per rank, the largest rank's reported:
- tensors: torch's own accounting (torch.distributed._tools.mem_tracker.MemTracker) over one step after a warm-up
  step: the most bytes of tensors alive at once (parameters, gathered ones included, gradients, optimizer state,
  activations, temporaries), and of those the activations and temporaries at that moment: what grows with the
  sequence. It does not see gloo's buffers or the allocator's slack.
- resident: the process's peak resident memory during the timed steps (VmHWM, reset after the warm-up step) minus its
  resident memory before them. glibc's malloc is told to map every allocation over 64 KiB on its own
  (MALLOC_MMAP_THRESHOLD_), so a freed tensor goes back to the system at once: with its default threshold, which
  grows as large blocks are freed, freed tensors stay in its heap and the high-water mark depends on the order of
  earlier allocations more than on the step.
The step time is the median over --steps steps after the warm-up step (untracked). The ranks share this machine's
cores: on a machine with fewer cores than S, time grows with S for that reason alone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

COLUMNS = ("tensors", "activations", "resident")  # each rank's peaks (module docstring), in bytes


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _rank(rank: int, world_size: int, port: int, args: argparse.Namespace, length: int, out: str) -> None:
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    from roll_lite.data import DataProto
    from roll_lite.loss import sft_loss_func
    from roll_lite.model.modeling import build_causal_lm, enable_gradient_checkpointing
    from roll_lite.strategy import FSDP2Strategy, StrategyConfig
    from roll_lite.strategy.distributed import close_distributed, init_distributed, join_group_store

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size))
    torch.set_num_threads(args.threads)
    init_distributed(store=join_group_store("127.0.0.1", port, world_size))
    model = build_causal_lm(
        dict(
            model_type="qwen2",
            vocab_size=args.vocab,
            hidden_size=args.hidden,
            intermediate_size=4 * args.hidden,
            num_hidden_layers=args.layers,
            num_attention_heads=args.heads,
            num_key_value_heads=args.kv_heads,
            max_position_embeddings=max(length, 128),
            tie_word_embeddings=False,
        ),
        seed=0,
    )
    if not args.no_checkpointing:
        enable_gradient_checkpointing(model)
    # packed, as long sequences should be: the padded path's whole-sequence mask is [tokens, tokens] on every rank
    config = StrategyConfig(sequence_parallel=world_size, use_packing=True, logprob_chunk_size=1024, lr=1e-5)
    strategy = FSDP2Strategy(model, config, shard_single_rank=True)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, args.vocab, (1, length), generator=generator)
    mask = torch.ones(1, length, dtype=torch.long)
    response = mask.clone()
    response[:, 0] = 0
    data = DataProto({"input_ids": ids, "attention_mask": mask, "response_mask": response})
    data.meta_info["loss_mask_keys"] = ["response_mask"]
    loss = sft_loss_func()
    start = time.perf_counter()
    strategy.train_step(data, loss)  # warm-up: the optimizer state exists from here on
    times = [time.perf_counter() - start]
    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) from the current resident size on
    before = _status("VmRSS")
    for _ in range(args.steps):
        start = time.perf_counter()
        strategy.train_step(data, loss)
        times.append(time.perf_counter() - start)
    resident = _status("VmHWM") - before
    tracker = MemTracker()
    tracker.track_external(strategy.model, strategy.optimizer)
    with tracker:
        strategy.train_step(data, loss)
    peak = max(tracker.get_tracker_snapshot("peak").values(), key=lambda peaks: peaks["Total"])
    step_tensors = sum(size for kind, size in peak.items() if getattr(kind, "name", None) in ("ACT", "TEMP"))
    seconds = statistics.median(times[1:] or times)
    result = {"tensors": peak["Total"], "activations": step_tensors, "resident": resident, "seconds": seconds}
    Path(f"{out}.{rank}").write_text(json.dumps(result))
    close_distributed()
    os._exit(0)  # gloo's helper threads: leave without the interpreter's teardown (tests/spawned_ranks.py)


def measure(args: argparse.Namespace, degree: int, length: int) -> dict:
    import torch.multiprocessing as mp

    from roll_lite.strategy.distributed import open_group_store

    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(64 * 1024))  # read by each rank's malloc (docstring)
    store = open_group_store("127.0.0.1", degree)
    with tempfile.TemporaryDirectory() as folder:
        out = str(Path(folder) / "rank")
        mp.start_processes(_rank, args=(degree, store.port, args, length, out), nprocs=degree, start_method="spawn")
        ranks = [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(degree)]
    del store
    return {name: max(r[name] for r in ranks) for name in COLUMNS + ("seconds",)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="2048,8192,32768", help="tokens of the one sequence, comma-separated")
    parser.add_argument("--degrees", default="1,2,4", help="S, comma-separated (each must divide --heads)")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument(
        "--steps", type=int, default=2, help="timed steps after one warm-up step (0: the warm-up step alone, timed)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--no-checkpointing", action="store_true", help="keep every layer's activations")
    args = parser.parse_args()
    lengths = [int(value) for value in args.lengths.split(",")]
    degrees = [int(value) for value in args.degrees.split(",")]
    params = args.layers * (12 * args.hidden**2) + 2 * args.vocab * args.hidden
    print(
        f"qwen2 ~{params / 1e6:.0f} M parameters (hidden {args.hidden}, {args.layers} layers, {args.heads} heads, "
        f"{args.kv_heads} KV heads), float32, CPU gloo, D = 1, activation checkpointing "
        f"{'off' if args.no_checkpointing else 'on'}, median of {args.steps} steps"
    )
    columns = (f"S={s}: tensors | S={s}: of which activations | S={s}: resident | S={s}: step s" for s in degrees)
    print("| tokens | " + " | ".join(columns) + " |")
    print("|---|" + "---|---|---|---|" * len(degrees))
    for length in lengths:
        cells = []
        for degree in degrees:
            result = measure(args, degree, length)
            cells += [f"{result[name] / 2**20:.0f} MiB" for name in COLUMNS]
            cells.append(f"{result['seconds']:.2f}")
        print(f"| {length} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
