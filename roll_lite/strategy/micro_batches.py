"""One rank's part of a training step, with no collectives: the FSDP2 strategy wraps it with
all-reduces, and the loss-invariance checker runs it for simulated ranks in one process.

Order of a step on a rank: sum the masks of its whole share (`local_mask_sums`; the strategy
all-reduces them into the global stats), split the share into micro-batches
(`split_micro_batches`), then `train_micro_batches` runs forward / loss_func / backward on each,
with the loss scaled by D·A and divided by A, as gradient accumulation does.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import torch

from roll_lite.data import DataProto
from roll_lite.data.masks import check_binary_mask
from roll_lite.model.batch_invariant import batch_invariant_kernels
from roll_lite.model.packing import (
    karmarkar_karp,
    pack_rows,
    row_lengths,
    token_budget_groups,
    unpack_next_token_values,
)
from roll_lite.strategy.config import StrategyConfig
from roll_lite.strategy.vision_inputs import image_inputs

# loss_func(micro_batch, model_output) -> (loss, metrics); roll_lite/loss/__init__.py says more
LossFunc = Callable[[DataProto, dict[str, torch.Tensor]], tuple[torch.Tensor, dict[str, torch.Tensor]]]


def loss_mask_keys(data: DataProto) -> list[str]:
    keys = data.meta_info.get("loss_mask_keys")
    if keys is None:
        raise KeyError(
            "data.meta_info['loss_mask_keys'] is not set: name the mask(s) your loss_func aggregates over, "
            "e.g. ['response_mask'], so the strategy can compute their global token and sample counts"
        )
    if isinstance(keys, str):
        keys = [keys]
    missing = [key for key in keys if key not in data.batch]
    if missing:
        raise KeyError(f"loss_mask_keys {missing} are not tensors of the batch (has: {sorted(data.batch)})")
    return list(keys)


def local_mask_sums(data: DataProto, mask_keys: Sequence[str]) -> torch.Tensor:
    """[2, K] float64: row 0 the token count, row 1 the count of rows with a token, per mask key."""
    sums = torch.zeros(2, len(mask_keys), dtype=torch.float64)
    for k, key in enumerate(mask_keys):
        check_binary_mask(data[key], key)
        mask = data[key].bool()
        sums[0, k] = mask.sum()
        sums[1, k] = (mask.sum(-1) > 0).sum()
    return sums


def global_stats_meta(sums: torch.Tensor, mask_keys: Sequence[str]) -> dict:
    """The meta_info entries injected into every micro-batch, from all-reduced `local_mask_sums`."""
    return {
        "batch_num_tokens": {key: sums[0, k].clone() for k, key in enumerate(mask_keys)},
        "global_valid_samples": {key: sums[1, k].clone() for k, key in enumerate(mask_keys)},
    }


def row_units(data: DataProto) -> list[list[int]]:
    """The rows that must stay together, on one rank and in one micro-batch: each block of
    meta_info['rows_together'] consecutive rows (2 for preference pairs: chosen, rejected), or single rows."""
    size = int(data.meta_info.get("rows_together", 1))
    if size < 1 or len(data) % size:
        raise ValueError(
            f"meta_info['rows_together'] = {size}: the batch's {len(data)} rows are not whole blocks of it"
        )
    return [list(range(start, start + size)) for start in range(0, len(data), size)]


def _rows_of(units: list[list[int]], unit_groups: list[list[int]]) -> list[list[int]]:
    return [[row for unit in group for row in units[unit]] for group in unit_groups]


def micro_batch_groups(data: DataProto, config: StrategyConfig) -> list[list[int]]:
    """Row indices of each micro-batch of this rank's share: A chunks (no packing; longest rows
    together when trim_padding is on, so that each chunk pads to a similar length), A token-balanced
    groups (packing), or as many groups as the token budget needs. Rows that stay together
    (`row_units`) are placed as one."""
    units = row_units(data)
    if not config.use_packing and not config.trim_padding:
        return data_parallel_groups(data, config.grad_accum_steps, balance_tokens=False)
    lengths = row_lengths(data["attention_mask"])
    unit_lengths = [sum(lengths[row] for row in unit) for unit in units]
    if not config.use_packing:
        by_length = sorted(range(len(units)), key=lambda u: (-unit_lengths[u], u))
        chunks = _contiguous_chunks(len(units), config.grad_accum_steps)
        return _rows_of(units, [sorted(by_length[u] for u in chunk) for chunk in chunks])
    if config.max_tokens_per_micro_batch is not None:
        budget = config.max_tokens_per_micro_batch
        longest = max(range(len(units)), key=unit_lengths.__getitem__, default=None)
        if longest is not None and len(units[longest]) > 1 and unit_lengths[longest] > budget:
            rows = units[longest]
            raise ValueError(
                f"rows {rows[0]}-{rows[-1]}, kept together (meta_info['rows_together']: a preference pair), have "
                f"{unit_lengths[longest]} tokens, more than max_tokens_per_micro_batch={budget}; raise the "
                "budget to at least the longest pair"
            )
        return _rows_of(units, token_budget_groups(unit_lengths, budget))
    return _rows_of(units, karmarkar_karp(unit_lengths, config.grad_accum_steps))


def trim_to_longest_row(micro_batch: DataProto) -> DataProto:
    """The micro-batch without the padding columns that none of its rows reach: every [rows, seq]
    tensor (second dimension = input_ids') cut to the longest row."""
    width = micro_batch["input_ids"].shape[1]
    longest = max(row_lengths(micro_batch["attention_mask"]), default=0)
    if longest in (0, width):
        return micro_batch
    batch = {
        name: t[:, :longest] if t.dim() >= 2 and t.shape[1] == width else t for name, t in micro_batch.batch.items()
    }
    return DataProto(batch, micro_batch.non_tensor_batch, micro_batch.meta_info)


def select_micro_batch(data: DataProto, group: list[int], config: StrategyConfig) -> DataProto:
    """The rows of one micro-batch (trimmed to its longest row when trim_padding is on)."""
    micro_batch = data.index_select(group)
    return trim_to_longest_row(micro_batch) if config.trim_padding else micro_batch


def split_micro_batches(data: DataProto, config: StrategyConfig) -> list[DataProto]:
    return [select_micro_batch(data, group, config) for group in micro_batch_groups(data, config)]


def data_parallel_groups(data: DataProto, world_size: int, balance_tokens: bool) -> list[list[int]]:
    """Row indices of the D rank shares of a global batch: token-balanced (Karmarkar–Karp) or
    contiguous chunks; rows that stay together (`row_units`) go to one rank."""
    units = row_units(data)
    if balance_tokens:
        lengths = row_lengths(data["attention_mask"])
        return _rows_of(units, karmarkar_karp([sum(lengths[row] for row in unit) for unit in units], world_size))
    return _rows_of(units, _contiguous_chunks(len(units), world_size))


def _contiguous_chunks(count: int, parts: int) -> list[list[int]]:
    base, extra = divmod(count, parts)
    sizes = [base + (1 if i < extra else 0) for i in range(parts)]
    return [list(range(sum(sizes[:i]), sum(sizes[: i + 1]))) for i in range(parts)]


def split_for_data_parallel(data: DataProto, world_size: int, balance_tokens: bool) -> list[DataProto]:
    return [data.index_select(group) for group in data_parallel_groups(data, world_size, balance_tokens)]


def forward_micro_batch(
    model, micro_batch: DataProto, config: StrategyConfig, with_entropy: bool, sequence_parallel=None
) -> dict:
    """The model's outputs for a micro-batch, packed or padded, as token-aligned [rows, seq] tensors
    (zero at position 0 and on padding). Log-probs are of softmax(logits / meta_info["temperature"]),
    1 when the batch names none: an RL pipeline names the temperature its engine sampled at. With
    config.batch_invariant under the batch-invariant kernels (roll_lite/model/batch_invariant.py).
    `sequence_parallel` (roll_lite/strategy/sequence_parallel.py) runs the model on this rank's slice of
    the sequence and hands back the whole sequence's outputs, as the model alone would."""
    images = image_inputs(model, micro_batch)  # its rows' images (vision_inputs.py)
    if sequence_parallel is not None:
        model = functools.partial(sequence_parallel.run, model)
    with batch_invariant_kernels(config.batch_invariant):
        return _forward_micro_batch(model, micro_batch, config, with_entropy, images)


def _forward_micro_batch(model, micro_batch: DataProto, config: StrategyConfig, with_entropy: bool, images) -> dict:
    input_ids, attention_mask = micro_batch["input_ids"], micro_batch["attention_mask"]
    seq_len = input_ids.shape[1]
    head_options = dict(temperature=float(micro_batch.meta_info.get("temperature", 1.0)), with_entropy=with_entropy)
    head_options.update(images)
    if micro_batch.meta_info.get("teacher_top_k"):  # a teacher's pass: its top-k next tokens too
        head_options["top_k"] = int(micro_batch.meta_info["teacher_top_k"])
    top_k_ids = micro_batch.batch.get("teacher_top_k_ids")  # a student's: its log-probs of the teacher's top k
    if config.use_packing:
        lengths = row_lengths(attention_mask)
        packed = pack_rows(input_ids, lengths)
        if top_k_ids is not None:  # packed like the tokens; position p then holds token p+1's ids
            ids = torch.cat([top_k_ids[i, :length] for i, length in enumerate(lengths)])[None]
            head_options["gather_ids"] = torch.roll(ids, shifts=-1, dims=1)
        outputs = model(
            packed.input_ids,
            packed.position_ids,
            cu_seqlens=packed.cu_seqlens,
            max_seqlen=packed.max_seqlen,
            **head_options,
        )
        return {name: unpack_next_token_values(values, packed, seq_len) for name, values in outputs.items()}
    if top_k_ids is not None:
        head_options["gather_ids"] = torch.roll(top_k_ids, shifts=-1, dims=1)
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    outputs = model(input_ids, position_ids, attention_mask=attention_mask, **head_options)
    valid = attention_mask.bool()
    valid[:, 0] = False

    def token_aligned(values):
        shifted = torch.cat([torch.zeros_like(values[:, :1]), values[:, :-1]], dim=1)
        keep = valid.reshape(valid.shape + (1,) * (values.dim() - 2))  # [rows, seq] or [rows, seq, k] values
        return torch.where(keep, shifted, torch.zeros((), dtype=values.dtype, device=values.device))

    return {name: token_aligned(values) for name, values in outputs.items()}


def forward_placeholder(model, device: torch.device) -> torch.Tensor:
    """A one-token forward that touches every parameter: what a rank with fewer real micro-batches
    runs so that all ranks make the same FSDP2 collective calls. Its output is multiplied by 0."""
    token = torch.zeros(1, 1, dtype=torch.long, device=device)
    outputs = model(token, torch.zeros_like(token), attention_mask=torch.ones_like(token))
    return sum(values.sum() for values in outputs.values()) * 0.0


LOSS_FUNC_CONTRACT = "loss_func(micro_batch, model_output) must return (loss, metrics): a scalar tensor and a dict"


def call_loss_func(loss_func: LossFunc, micro_batch: DataProto, output: dict) -> tuple[torch.Tensor, dict]:
    """loss_func's (loss, metrics), checked against the contract, with errors that name it."""
    result = loss_func(micro_batch, output)
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        got = type(result).__name__ + (f" of length {len(result)}" if isinstance(result, (tuple, list)) else "")
        raise TypeError(f"{LOSS_FUNC_CONTRACT}; {_name(loss_func)} returned a {got}")
    loss, metrics = result
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise TypeError(f"{LOSS_FUNC_CONTRACT}; {_name(loss_func)} returned a loss of {shape}, not a scalar tensor")
    if metrics is not None and not isinstance(metrics, dict):
        raise TypeError(f"{LOSS_FUNC_CONTRACT}; {_name(loss_func)} returned metrics of type {type(metrics).__name__}")
    return loss.reshape(()), dict(metrics or {})


def _name(loss_func) -> str:
    return getattr(loss_func, "__qualname__", None) or type(loss_func).__name__


def train_micro_batches(
    model,
    micro_batches: Sequence[DataProto | None],
    loss_func: LossFunc,
    stats_meta: dict,
    config: StrategyConfig,
    world_size: int,
    device: torch.device,
    sequence_parallel=None,
    forward=None,
) -> list[dict]:
    """Forward / loss_func / backward for each micro-batch (None or empty: a placeholder pass); `forward`
    replaces forward_micro_batch (an MoE step's moe_forward, roll_lite/strategy/moe_stats.py).

    Gradients accumulate in the parameters' .grad; returns the metrics of each real micro-batch,
    plus 'loss@sum': the micro-batch's share of the loss whose gradient was applied. `world_size` is D,
    the data-parallel ranks; under sequence parallelism (`sequence_parallel`, S ranks per group) FSDP2
    averages over D·S ranks, each of which holds the gradient of its slice of the sequences only, so the
    backward multiplies by S too (roll_lite/strategy/sequence_parallel.py derives it).
    """
    num_micro_batches = len(micro_batches)
    loss_scale = world_size * num_micro_batches if config.apply_loss_scale else 1.0
    grad_scale = loss_scale / num_micro_batches
    if sequence_parallel is not None:
        grad_scale *= sequence_parallel.degree
    records = []
    for index, micro_batch in enumerate(micro_batches):
        if micro_batch is None or len(micro_batch) == 0:
            forward_placeholder(model, device).backward()
            continue
        micro_batch = micro_batch.to(device)
        micro_batch.meta_info.update(stats_meta)
        micro_batch.meta_info.update(
            loss_scale=loss_scale, micro_batch_index=index, num_micro_batches=num_micro_batches
        )
        output = (forward or forward_micro_batch)(
            model, micro_batch, config, with_entropy=True, sequence_parallel=sequence_parallel
        )
        loss, metrics = call_loss_func(loss_func, micro_batch, output)
        if not loss.requires_grad:
            raise ValueError(f"loss_func's loss for micro-batch {index} does not depend on the model output")
        # Gradient accumulation divides by A and FSDP2 averages over D; loss_scale = D·A undoes both.
        (loss * grad_scale).backward()
        record = metrics
        record["loss@sum"] = loss.detach() * loss_scale / (num_micro_batches * world_size)
        records.append(record)
    return records


def pad_columns(values: torch.Tensor, width: int) -> torch.Tensor:
    """[rows, w] -> [rows, width] (or [rows, w, k] -> [rows, width, k]), zeros on the right."""
    if values.shape[1] == width:
        return values
    return torch.nn.functional.pad(values, (0, 0) * (values.dim() - 2) + (0, width - values.shape[1]))


def pad_to_count(micro_batches: list[DataProto], count: int) -> list[DataProto | None]:
    return list(micro_batches) + [None] * (count - len(micro_batches))
