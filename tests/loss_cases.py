"""The RL losses' part of the exactness matrix (distributed_harness.py; the pair losses' is pair_cases.py):
each loss by name with the masks it reads (MASK_KEYS) and its loss_func as the pipelines build it
(make_loss), the global batch of uneven rows and partly empty masks, with multi-turn masks and a
teacher's log-probs, the critic's non-zero value head, and the tiny model with LoRA adapters."""

from __future__ import annotations

import torch

from roll_lite.lora.adapters import add_adapters
from roll_lite.lora.settings import LoraSettings
from roll_lite.loss import (
    RolloutCorrection,
    cispo_policy_loss_func,
    gspo_token_policy_loss_func,
    kl_regularized_loss_func,
    mask_stats,
    ppo_policy_loss_func,
    reverse_kl_loss_func,
    sequence_policy_loss_func,
    sft_loss_func,
    top_k_forward_kl_loss_func,
    value_loss_func,
)
from roll_lite.loss.checker import TINY_MODEL, random_rl_batch
from roll_lite.model.modeling import build_causal_lm

SEQ_LEN = 16
BUDGET = 29  # tokens per micro-batch in the token-budget cases: the two ranks need 2 and 1
MASK_KEYS = {
    "ppo": ["response_mask"],
    "sequence": ["response_mask"],
    "ppo_kl": ["response_mask", "kl_mask"],
    "gspo_token": ["response_mask"],
    "cispo": ["response_mask"],
    # the rollout correction's masks (weight 0 inside loss_mat, the global denominators unchanged)
    "ppo_mis": ["response_mask"],
    "gspo_seqmask": ["response_mask"],
    "ppo_bypass": ["response_mask"],
    "value": ["response_mask"],  # the critic: FSDP2Strategy(head='value')
    "sft": ["kl_mask"],  # a target mask with holes, like a conversation's assistant turns (token-mean only)
    # Multi-turn: the model's own tokens (model_mask) between environment / tool spans of varied length
    "multiturn_ppo": ["model_mask"],
    "multiturn_ppo_kl": ["model_mask"],
    "multiturn_value": ["model_mask"],
    "distill_rkl": ["response_mask"],  # on-policy distillation: the teacher's reverse KL as a loss
    "distill_topk": ["response_mask"],  # and the forward KL over the teacher's top k (the student's chunked gather)
}
CRITIC_LOSSES = {"value", "multiturn_value"}
# A user's own loss_func (user_loss_func), in the sequence-parallel rows (test_exactness_sp.py)
USER_MASK_KEYS = {"user": ["response_mask"]}


def user_loss_func(batch, output):
    """A loss written as a user would, with the global counts (mask_stats) and no roll_lite aggregation:
    per sequence the square of its mean log-ratio to the old policy (a whole row's value, not a sum of
    its tokens'), a token-mean policy gradient term, and an entropy bonus."""
    mask = batch["response_mask"].bool()
    stats = mask_stats(batch.meta_info, "response_mask")
    zero = torch.zeros((), dtype=output["log_probs"].dtype)
    log_ratio = torch.where(mask, output["log_probs"] - batch["old_log_probs"], zero)
    per_sequence = (log_ratio.sum(-1) / mask.sum(-1).clamp(min=1)) ** 2
    tokens = stats["batch_num_tokens"].clamp(min=1)
    policy = torch.where(mask, -batch["advantages"] * output["log_probs"], zero).sum() / tokens
    entropy = torch.where(mask, output["entropy"], zero).sum() / tokens
    loss = per_sequence.sum() / stats["global_valid_samples"].clamp(min=1) + policy - 0.01 * entropy
    return loss, {"user_loss@sum": loss.detach()}


def make_loss(name: str, mode: str):
    if name == "user":
        return user_loss_func
    if name == "ppo":
        # truncated importance sampling on: a token's weight depends on that token alone
        return ppo_policy_loss_func(
            mode, seq_len_norm=SEQ_LEN, dual_clip_c=3.0, entropy_coef=0.01, rollout_is="token", rollout_is_cap=1.2
        )
    if name == "sequence":
        # and per sequence: on the whole row, which a micro-batch always holds
        return sequence_policy_loss_func(
            mode,
            clip_ratio_low=0.1,
            clip_ratio_high=0.12,
            seq_len_norm=SEQ_LEN,
            rollout_is="sequence",
            rollout_is_cap=1.5,
        )
    if name == "gspo_token":
        return gspo_token_policy_loss_func(
            mode, clip_ratio_low=0.1, clip_ratio_high=0.12, seq_len_norm=SEQ_LEN, rollout_is="token", rollout_is_cap=1.2
        )
    if name == "cispo":  # a clip range the ratios cross on both sides
        return cispo_policy_loss_func(
            mode,
            clip_ratio_low=0.1,
            clip_ratio_high=0.1,
            seq_len_norm=SEQ_LEN,
            entropy_coef=0.01,
            rollout_is="sequence",
            rollout_is_cap=1.5,
        )
    if name == "ppo_mis":  # TIS and the token band together (IcePop-like), and the veto
        correction = RolloutCorrection(
            rollout_is="token",
            rollout_is_cap=1.2,
            rollout_mask="token",
            rollout_mask_low=0.7,
            rollout_mask_high=1.4,
            rollout_veto_threshold=3.0,
        )
        return ppo_policy_loss_func(
            mode, seq_len_norm=SEQ_LEN, dual_clip_c=3.0, entropy_coef=0.01, correction=correction
        )
    if name == "gspo_seqmask":  # rows dropped by their geometric mean ratio, TIS per sequence on the rest
        correction = RolloutCorrection(
            rollout_is="sequence",
            rollout_is_cap=1.5,
            rollout_mask="sequence",
            rollout_mask_low=0.9,
            rollout_mask_high=1.1,
        )
        return sequence_policy_loss_func(
            mode, clip_ratio_low=0.1, clip_ratio_high=0.12, seq_len_norm=SEQ_LEN, correction=correction
        )
    if name == "ppo_bypass":  # the engine's log-probs as π_old, with the sequence mask and the veto
        correction = RolloutCorrection(
            rollout_bypass=True,
            rollout_mask="sequence",
            rollout_mask_low=0.9,
            rollout_mask_high=1.1,
            rollout_veto_threshold=3.0,
        )
        return ppo_policy_loss_func(mode, seq_len_norm=SEQ_LEN, entropy_coef=0.01, correction=correction)
    if name == "sft":
        return sft_loss_func(MASK_KEYS["sft"][0])
    if name == "value":
        # With the head below, about a third of the response tokens take the clipped branch.
        return value_loss_func(mode, clip_range=0.5, seq_len_norm=SEQ_LEN)
    if name == "multiturn_ppo":
        return ppo_policy_loss_func(
            mode,
            seq_len_norm=SEQ_LEN,
            dual_clip_c=3.0,
            entropy_coef=0.01,
            mask_key="model_mask",
            rollout_is="token",
            rollout_is_cap=1.2,
        )
    if name == "multiturn_value":
        return value_loss_func(mode, clip_range=0.5, seq_len_norm=SEQ_LEN, mask_key="model_mask")
    if name == "distill_rkl":  # PPO on the task advantages + 0.7 × the k2 estimate of KL(π_S‖π_T)
        policy = ppo_policy_loss_func(mode, seq_len_norm=SEQ_LEN, entropy_coef=0.01)
        return reverse_kl_loss_func(policy, mode, coef=0.7, estimator="k2", seq_len_norm=SEQ_LEN)
    if name == "distill_topk":  # PPO + 0.7 × Σ p_T (log p_T − log p_S) over the teacher's top 3 ids
        return top_k_forward_kl_loss_func(
            ppo_policy_loss_func(mode, seq_len_norm=SEQ_LEN), mode, coef=0.7, seq_len_norm=SEQ_LEN
        )
    if name == "multiturn_ppo_kl":
        return kl_regularized_loss_func(
            mode,
            kl_coef=0.5,
            kl_estimator="k3",
            seq_len_norm=SEQ_LEN,
            policy_mask_key="model_mask",
            kl_mask_key="model_mask",
        )
    return kl_regularized_loss_func(mode, kl_coef=0.5, kl_estimator="k3", seq_len_norm=SEQ_LEN)


def value_head_weights(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """A non-zero value head (the critic's starts at zero, which would leave the backbone without a
    gradient): values of about unit scale, like the batch's returns and old values."""
    weight = 0.2 * torch.randn(
        1, TINY_MODEL["hidden_size"], generator=torch.Generator().manual_seed(5), dtype=torch.float64
    )
    return {
        "value_head.weight": weight.to(dtype),
        "value_head.bias": torch.tensor([0.1], dtype=torch.float64).to(dtype),
    }


LORA = LoraSettings(rank=4, alpha=8.0, target_modules="all-linear")


def lora_model(dtype: torch.dtype) -> torch.nn.Module:
    """The tiny model with adapters on every Linear layer but the head, lora_B non-zero (it starts at
    zero, which would leave lora_A without a gradient)."""
    lm = add_adapters(build_causal_lm(TINY_MODEL, dtype=dtype, seed=0), LORA, seed=1)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, parameter in lm.named_parameters():
            if ".lora_B." in name:
                parameter.copy_(0.2 * torch.randn(parameter.shape, generator=generator, dtype=torch.float64))
    return lm


def global_batch(dtype: torch.dtype, rows: int = 7):
    # 7 rows of uneven length (one of 2 tokens), two rows with an all-zero response mask, one with
    # an all-zero kl_mask: shares and micro-batches get uneven and partly empty.
    data = random_rl_batch(num_rows=7, seq_len=SEQ_LEN, mask_keys=["response_mask", "kl_mask"], seed=11, dtype=dtype)
    data.batch["model_mask"] = multi_turn_mask(data["response_mask"])
    data.batch["teacher_log_probs"] = data["ref_log_probs"].flip(-1)  # another policy's log-probs
    return data.slice(0, rows)


def multi_turn_mask(response_mask: torch.Tensor, seed: int = 23) -> torch.Tensor:
    """The model's own tokens of multi-turn trajectories: each row's response alternates model turns
    and environment / tool spans (1-3 tokens each, the model first); 0 outside the response."""
    generator = torch.Generator().manual_seed(seed)
    model_mask = torch.zeros_like(response_mask)
    for row, mask in enumerate(response_mask):
        positions = mask.nonzero().flatten().tolist()
        start, model_turn = 0, True
        while start < len(positions):
            span = int(torch.randint(1, 4, (1,), generator=generator))
            if model_turn:
                model_mask[row, positions[start : start + span]] = 1
            start, model_turn = start + span, not model_turn
    return model_mask
