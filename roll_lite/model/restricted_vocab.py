"""Log-probs and entropy over a vocabulary without some tokens: the distribution the rollout engine samples
from when it masks them out (a vision-language policy never samples its vision special tokens).

With E the excluded ids and m = Σ_{e∈E} p(e) their mass under the full softmax, the restricted distribution is
p'(y) = p(y) / (1 - m) over the other tokens, so

    log p'(y) = log p(y) - log(1 - m)
    H'        = (H + Σ_e p(e) log p(e)) / (1 - m) + log(1 - m)

computed from one chunked pass that gathers the excluded ids' log-probs beside each target's
(chunked_log_probs with [N, 1 + |E|] targets): exact in real arithmetic, and differentiable. At a position
whose target is an excluded id (an image token of a prompt: never trained) the value is finite, not -inf, so
that a mask times it stays 0. m is kept below 1 so that a policy putting all its mass on them stays finite.
"""

from __future__ import annotations

from typing import Sequence

import torch

from roll_lite.model.logprobs import chunked_log_probs


def restricted_log_probs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    excluded_ids: Sequence[int],
    *,
    chunk_size: int = 1024,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """chunked_log_probs(hidden, weight, targets [N], ...) over the vocabulary without `excluded_ids`."""
    excluded = torch.as_tensor(list(excluded_ids), dtype=targets.dtype, device=targets.device)
    both = torch.cat([targets.reshape(-1, 1), excluded.expand(len(targets), -1)], dim=1)
    log_probs, entropy = chunked_log_probs(
        hidden, weight, both, chunk_size=chunk_size, temperature=temperature, with_entropy=with_entropy
    )
    return restrict_log_probs(log_probs, entropy)


def restrict_log_probs(
    log_probs: torch.Tensor, entropy: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log p'(y), H') from the full vocabulary's log-probs [N, 1 + |E|] of each target then the excluded
    ids, and its entropy [N] (or None). Also the exact decoding loop's (roll_lite/model/exact_vision.py)."""
    sampled, others = log_probs[:, 0], log_probs[:, 1:]
    excluded_p = others.exp()
    limit = 1.0 - torch.finfo(log_probs.dtype).eps
    log_kept = torch.log1p(-excluded_p.sum(-1).clamp(max=limit))  # log(1 - m)
    if entropy is not None:
        entropy = (entropy + (excluded_p * others).sum(-1)) / log_kept.exp() + log_kept
    return sampled - log_kept, entropy
