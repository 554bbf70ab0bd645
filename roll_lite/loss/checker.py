"""Loss-invariance checker: does a loss_func give the same step under every (D, A, packing)?

Run it on your loss_func before training:

    roll-check-loss my_pkg.losses:my_loss_func --mask-keys response_mask
    roll-check-loss my_pkg.losses:my_pair_loss --pairs   # on preference pairs laid out as the pipelines do

It builds a random RL batch (or pairs; check_batches.py) and a tiny model (float64), computes the
loss and gradient of one forward/backward over the whole batch, then replays the strategy's step for several partitions:
D simulated ranks (token-balanced shares when packing), their micro-batches (count or token
budget, padded or packed), the global mask stats, loss_scale = D·A, gradient accumulation and
FSDP2's average over ranks. It is the strategy's own per-rank code (strategy/micro_batches.py),
minus the collectives, which it replaces by sums in one process. It also runs the checks that
partitions cannot see (roll_lite.loss.checks): undeclared masks, unmasked numerators, padded-width
normalisers. Each failure is one line naming its cause and fix, above the table of deviations;
with raise_on_failure they raise.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from roll_lite.data import DataProto
from roll_lite.data.pairs import PAIR_MASK_KEYS
from roll_lite.loss.check_batches import random_pair_batch, random_rl_batch
from roll_lite.loss.checks import (
    RecordingDict,
    StepResult,
    mask_discipline_failure,
    padding_width_failure,
    relative_deviation,
    undeclared_mask_failure,
    undeclared_mask_reads,
    worst_grad_deviation,
)
from roll_lite.loss.policy import POLICY_LOSSES
from roll_lite.model.modeling import (
    CausalLMWithLogProbs,
    CausalLMWithScoreHead,
    CausalLMWithValueHead,
    build_causal_lm,
)
from roll_lite.runtime.importing import load_object
from roll_lite.runtime.metrics import reduce_metrics
from roll_lite.runtime.threads import one_torch_thread
from roll_lite.strategy.config import StrategyConfig
from roll_lite.strategy.micro_batches import (
    LossFunc,
    call_loss_func,
    forward_micro_batch,
    global_stats_meta,
    local_mask_sums,
    loss_mask_keys,
    pad_to_count,
    split_for_data_parallel,
    split_micro_batches,
    train_micro_batches,
)

TINY_MODEL = dict(
    model_type="qwen2",
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    tie_word_embeddings=False,
)


@dataclass(frozen=True)
class Partition:
    world_size: int
    grad_accum_steps: int = 1
    use_packing: bool = False
    max_tokens_per_micro_batch: int | None = None

    @property
    def label(self) -> str:
        if self.max_tokens_per_micro_batch is not None:
            return f"D={self.world_size} budget={self.max_tokens_per_micro_batch} packed"
        return f"D={self.world_size} A={self.grad_accum_steps} {'packed' if self.use_packing else 'padded'}"


REFERENCE = Partition(1, 1, False)
DEFAULT_PARTITIONS = (
    Partition(1, 2, False),
    Partition(1, 3, True),
    Partition(2, 1, False),
    Partition(2, 2, True),
    Partition(2, 3, False),
    Partition(4, 1, True),
    Partition(2, max_tokens_per_micro_batch=24, use_packing=True),
)
# A batch of preference pairs (random_pair_batch) keeps each pair in one micro-batch: the budget fits a pair.
PAIR_PARTITIONS = DEFAULT_PARTITIONS[:-1] + (Partition(2, max_tokens_per_micro_batch=40, use_packing=True),)


class LossInvarianceError(AssertionError):
    pass


def simulate_step(
    model: torch.nn.Module,
    data: DataProto,
    loss_func: LossFunc,
    partition: Partition,
    apply_loss_scale: bool = True,
    trim_padding: bool = True,
) -> StepResult:
    """(loss, {param name: grad}) of one strategy step under `partition`, in one process."""
    config = StrategyConfig(
        grad_accum_steps=partition.grad_accum_steps,
        use_packing=partition.use_packing,
        max_tokens_per_micro_batch=partition.max_tokens_per_micro_batch,
        apply_loss_scale=apply_loss_scale,
        trim_padding=trim_padding,
    )
    world_size = partition.world_size
    keys = loss_mask_keys(data)
    shares = split_for_data_parallel(data, world_size, balance_tokens=partition.use_packing)
    stats_meta = global_stats_meta(sum(local_mask_sums(share, keys) for share in shares), keys)
    per_rank = [split_micro_batches(share, config) for share in shares]
    count = max(len(micro_batches) for micro_batches in per_rank)
    model.zero_grad(set_to_none=True)
    records = []
    for micro_batches in per_rank:
        records += train_micro_batches(
            model, pad_to_count(micro_batches, count), loss_func, stats_meta, config, world_size, torch.device("cpu")
        )
    # FSDP2 averages the ranks' gradients.
    grads = {name: p.grad.detach() / world_size for name, p in model.named_parameters() if p.grad is not None}
    return reduce_metrics(records)["loss"], grads


def read_keys(
    model: torch.nn.Module, data: DataProto, loss_func: LossFunc
) -> tuple[set[object], set[object], set[str]]:
    """(batch keys, meta_info keys) that one call of loss_func on the whole batch reads, and the names
    of the metrics it returns ('pg_loss@sum', ...)."""
    keys = loss_mask_keys(data)
    stats_meta = global_stats_meta(local_mask_sums(data, keys), keys)
    with torch.no_grad():
        output = forward_micro_batch(model, data, StrategyConfig(), with_entropy=True)
        probe = DataProto(data.batch, data.non_tensor_batch, {**data.meta_info, **stats_meta})
        probe.batch, probe.meta_info = RecordingDict(probe.batch), RecordingDict(probe.meta_info)
        _, metrics = call_loss_func(loss_func, probe, output)
    return probe.batch.read, probe.meta_info.read, set(metrics)


def diagnose(model: torch.nn.Module, data: DataProto, loss_func: LossFunc) -> list[str]:
    """Likely causes of a partition deviation, found by watching loss_func on the whole batch."""
    keys = loss_mask_keys(data)
    stats_meta = global_stats_meta(local_mask_sums(data, keys), keys)
    _, meta_read, _ = read_keys(model, data, loss_func)
    with torch.no_grad():
        output = forward_micro_batch(model, data, StrategyConfig(), with_entropy=True)
        with_stats = lambda meta: DataProto(data.batch, data.non_tensor_batch, {**data.meta_info, **meta})  # noqa: E731
        loss, _ = call_loss_func(loss_func, with_stats(stats_meta), output)
        doubled = {name: {key: 2 * value for key, value in per_key.items()} for name, per_key in stats_meta.items()}
        loss_doubled, _ = call_loss_func(loss_func, with_stats(doubled), output)

    used_stats = {"batch_num_tokens", "global_valid_samples"} & meta_read
    if not used_stats or abs(loss.item() - loss_doubled.item()) <= 1e-12 * max(1.0, abs(loss.item())):
        if int(data.meta_info.get("rows_together", 1)) > 1:  # preference pairs
            return [
                "loss_func does not use the global stats in meta_info (global_valid_samples): it likely divides "
                "by the micro-batch's own pair count (e.g. a mean over its pairs). Divide the sum over its pairs "
                "by mask_stats(batch.meta_info, 'chosen_mask')['global_valid_samples'], the step's pair count."
            ]
        return [
            "loss_func does not use the global stats in meta_info (batch_num_tokens / global_valid_samples): it "
            "likely normalises by the micro-batch's own loss_mask.sum() (e.g. a masked mean). Use agg_loss(..., "
            "**mask_stats(batch.meta_info, mask_key)) so every micro-batch divides by the step's global count."
        ]
    return [
        "the loss is not a sum of per-micro-batch shares: look for a non-linear function of a batch-level "
        "aggregate (e.g. squaring or exponentiating a mean over the micro-batch), or apply_loss_scale not matching "
        "how the loss is normalised."
    ]


@dataclass
class InvarianceReport:
    rows: list[tuple[str, float, float]]  # (partition, loss deviation, worst grad deviation)
    tolerance: float
    causes: list[str]  # likely causes of a partition deviation
    failures: list[str] = field(default_factory=list)  # one line per failed check (partitions included)
    metrics: set[str] = field(default_factory=set)  # the names of the metrics the loss reports

    @property
    def worst(self) -> float:
        return max(max(loss_dev, grad_dev) for _, loss_dev, grad_dev in self.rows)

    @property
    def passed(self) -> bool:
        return self.worst <= self.tolerance and not self.failures

    def table(self) -> str:
        """What failed first, one line per failed check with its fix (a partition deviation: then its likely
        cause and fix), then the deviation under each partition, then the verdict."""
        lines = []
        for failure in self.failures:
            lines.append(f"FAIL {failure}")
            if failure.startswith("partitions:"):
                lines += [f"likely cause: {cause}" for cause in self.causes]
        lines.append(f"{'partition':<28}{'loss rel. dev.':>16}{'grad rel. dev.':>16}")
        for label, loss_dev, grad_dev in self.rows:
            flag = "" if max(loss_dev, grad_dev) <= self.tolerance else "  FAIL"
            lines.append(f"{label:<28}{loss_dev:>16.2e}{grad_dev:>16.2e}{flag}")
        verdict = "PASS" if self.passed else "FAIL"
        checks = "partitions, declared masks, mask discipline, padded width"
        lines.append(
            f"{verdict}: worst relative deviation {self.worst:.2e} (tolerance {self.tolerance:.0e}); checked: {checks}"
        )
        return "\n".join(lines)


def _model_with_head(lm: torch.nn.Module, head: str, seed: int) -> torch.nn.Module:
    if head == "log_probs":
        return CausalLMWithLogProbs(lm)
    if head == "value":
        model = CausalLMWithValueHead(lm)
        torch.nn.init.normal_(model.value_head.weight, std=0.5, generator=torch.Generator().manual_seed(seed))
        return model
    if head == "score":
        model = CausalLMWithScoreHead(lm, seed)
        torch.nn.init.normal_(model.score.weight, std=0.5, generator=torch.Generator().manual_seed(seed))
        return model
    raise ValueError(f"unknown head '{head}'; choose log_probs, value or score")


# One intra-op thread, as tests/spawned_ranks.py runs the exactness matrix: HF's float64 model keeps some
# float32 math (RoPE's cos and sin, RMSNorm's variance), and on two threads it rounded otherwise in some
# processes (about 1 in 12), so that a correct loss failed at 5.8e-05 against the 1e-9 tolerance.
@one_torch_thread()
def check_loss_invariance(
    loss_func: LossFunc,
    loss_mask_keys: Sequence[str] | None = None,
    *,
    model_config: dict[str, Any] | None = None,
    data: DataProto | None = None,
    pairs: bool = False,
    partitions: Sequence[Partition] | None = None,
    apply_loss_scale: bool = True,
    tolerance: float = 1e-9,
    seed: int = 0,
    raise_on_failure: bool = True,
    head: str = "log_probs",
    allow_undeclared_masks: bool = False,
) -> InvarianceReport:
    """Check `loss_func` against one global forward/backward: under each (D, A, packing) partition,
    and for the mistakes partitions cannot see (roll_lite.loss.checks): reading a mask that is not
    declared, an unmasked numerator, a normaliser taken from the padded width.

    The batch: `data`, or a random RL batch, or with `pairs` a random batch of preference pairs laid out as
    the pair pipelines lay theirs out (two rows per pair that stay together, rows_together = 2).
    loss_mask_keys: the masks the loss reads (None: the batch's own declaration, the pipelines' for
    pairs; response_mask for the RL batch). partitions (None): DEFAULT_PARTITIONS, PAIR_PARTITIONS for pairs.
    head="log_probs": model_output has 'log_probs' and 'entropy' (policy losses, DPO); head="value":
    'values' (critic losses); head="score": 'scores' (a reward model's). The value and score heads start
    random here, not at zero or near it."""
    model_config = dict(model_config or TINY_MODEL)
    vocab_size = model_config.get("vocab_size", 64)
    if data is None and pairs:
        data = random_pair_batch(vocab_size=vocab_size, seed=seed)
    elif data is None:
        data = random_rl_batch(vocab_size=vocab_size, mask_keys=loss_mask_keys or ("response_mask",), seed=seed)
    declared = data.meta_info.get("loss_mask_keys") or ["response_mask"]
    keys = list(loss_mask_keys) if loss_mask_keys is not None else list(declared)
    data = DataProto(data.batch, data.non_tensor_batch, {**data.meta_info, "loss_mask_keys": keys})
    if partitions is None:
        partitions = PAIR_PARTITIONS if int(data.meta_info.get("rows_together", 1)) > 1 else DEFAULT_PARTITIONS
    model = _model_with_head(build_causal_lm(model_config, dtype=torch.float64, seed=seed), head, seed)

    def global_step(batch: DataProto, func: LossFunc) -> StepResult:  # the whole batch at its full width, untrimmed
        return simulate_step(model, batch, func, REFERENCE, apply_loss_scale, trim_padding=False)

    reference = global_step(data, loss_func)
    rows = [(REFERENCE.label + " (reference)", 0.0, 0.0)]
    for partition in partitions:
        loss, grads = simulate_step(model, data, loss_func, partition, apply_loss_scale)
        rows.append(
            (partition.label, relative_deviation(loss, reference[0]), worst_grad_deviation(grads, reference[1]))
        )
    batch_read, _, reported = read_keys(model, data, loss_func)
    report = InvarianceReport(rows, tolerance, [], metrics=reported)
    if report.worst > tolerance:
        label, loss_dev, grad_dev = max(rows, key=lambda row: max(row[1], row[2]))
        report.failures.append(
            f"partitions: the step under {label} deviates from the global batch by "
            f"{max(loss_dev, grad_dev):.1e} (relative; tolerance {tolerance:.0e})"
        )
        report.causes = diagnose(model, data, loss_func)
    stray = undeclared_mask_reads(data, keys, batch_read)
    if stray and not allow_undeclared_masks:
        report.failures.append(undeclared_mask_failure(stray, keys))
    for failure in (
        mask_discipline_failure(global_step, data, loss_func, keys, reference, tolerance),
        padding_width_failure(global_step, data, loss_func, reference, tolerance),
    ):
        if failure:
            report.failures.append(failure)
    if not report.passed and raise_on_failure:
        raise LossInvarianceError("loss_func fails the checker:\n" + report.table())
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="roll-check-loss", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "loss_func",
        help="import path of the loss_func, package.module:function, or a built-in "
        "policy loss by name (ppo, gspo, gspo_token, cispo: algorithm.policy_loss)",
    )
    parser.add_argument("--loss-agg-mode", default="token-mean", help="a built-in's aggregation (default: token-mean)")
    parser.add_argument(
        "--mask-keys",
        help="comma-separated loss_mask_keys (default: response_mask; with --pairs the pair pipelines' "
        f"{','.join(PAIR_MASK_KEYS)})",
    )
    parser.add_argument(
        "--pairs",
        action="store_true",
        help="check on preference pairs, laid out as the DPO and reward-model pipelines lay them out",
    )
    parser.add_argument("--model-config", type=Path, help="JSON file of a HF model config (default: a tiny Qwen2)")
    parser.add_argument("--tolerance", type=float, default=1e-9)
    parser.add_argument("--no-loss-scale", action="store_true", help="check with apply_loss_scale off")
    parser.add_argument(
        "--allow-undeclared-masks",
        action="store_true",
        help="do not fail when loss_func reads a mask outside --mask-keys (e.g. to select tokens for a metric)",
    )
    parser.add_argument(
        "--head",
        choices=("log_probs", "value", "score"),
        default="log_probs",
        help="what model_output holds: log_probs + entropy (policy losses, DPO), values (critic) or scores "
        "(a reward model, with --pairs)",
    )
    args = parser.parse_args(argv)
    mask_keys = (
        args.mask_keys.split(",") if args.mask_keys else list(PAIR_MASK_KEYS if args.pairs else ["response_mask"])
    )
    try:
        if args.pairs and set(mask_keys) - set(PAIR_MASK_KEYS):
            raise ValueError(
                f"--mask-keys {args.mask_keys}: a pair batch has no {sorted(set(mask_keys) - set(PAIR_MASK_KEYS))}; "
                f"its masks: {', '.join(PAIR_MASK_KEYS)}"
            )
        if args.loss_func in POLICY_LOSSES:
            loss_func = POLICY_LOSSES[args.loss_func](args.loss_agg_mode, mask_key=mask_keys[0])
        else:
            loss_func = load_object(args.loss_func, search_cwd=True)  # like `python -m`, after the installed packages
        if not callable(loss_func):
            raise TypeError(f"{args.loss_func} is not callable")
        model_config = json.loads(args.model_config.read_text()) if args.model_config else None
    except (ValueError, TypeError, ImportError, AttributeError, OSError) as error:
        print(f"roll-check-loss: {error}", file=sys.stderr)
        return 2
    report = check_loss_invariance(
        loss_func,
        mask_keys,
        model_config=model_config,
        pairs=args.pairs,
        apply_loss_scale=not args.no_loss_scale,
        tolerance=args.tolerance,
        raise_on_failure=False,
        head=args.head,
        allow_undeclared_masks=args.allow_undeclared_masks,
    )
    print(report.table())
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
