"""Token in, token out: a multi-turn trajectory is built from the token ids the engine sampled and the
tokens each observation adds, never by re-tokenizing the conversation's text (re-tokenized text drifts
from what was sampled: verl #6501, NeMo RL #2821, TRL #5242).

    prompt | model turn 1 (sampled) | observation 1 (chat-templated) | model turn 2 (sampled) | ...

`observation_ids` gives the tokens an observation adds after a model turn that ended with the end-of-turn
token: what the chat template puts after that token (e.g. Qwen's newline after <|im_end|>), the
observation as a user / tool message, and the generation prompt. `Trajectory` keeps the pieces apart,
so the model's tokens (model_mask: trained) and the environment's (conditioned on, never trained) are
known exactly. A vision-language policy's observations may hold images (environments/images.py): the
processor expands each image's placeholder once as its observation is appended (`observation_inputs`), and the
trajectory keeps its images' inputs in order (`Trajectory.images`), so that the engine generates each turn from
the ids and every image so far, and the trainer gets the same (`trajectory_batch`: non_tensor_batch["image_inputs"]).

With an MoE policy whose engine records routing (actor.router_replay), each token keeps the experts of the engine's
forward that first read it (roll_lite/rollout/engine.py `merge_routing`): a model turn's tokens those of the
decoding steps that read them as they were generated; the prompt, an observation and a turn's last token those of
the next turn's prefill; -1 where no forward read it (the trajectory's last token). docs/moe.md says what that makes
exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from roll_lite.data import DataProto
from roll_lite.data.chat import as_messages, render_chat
from roll_lite.data.sequences import build_sequence_batch, token_aligned_experts

# A conversation the template renders before the observation; only what follows its last assistant
# turn's end-of-turn token is kept, so these contents never reach a trajectory.
_BEFORE = [{"role": "user", "content": "1"}, {"role": "assistant", "content": "2"}]


class TemplateError(ValueError):
    """The chat template cannot continue a conversation token by token after a model turn."""


def observation_ids(
    tokenizer, observation: str | list[dict], end_of_turn_id: int | None = None, role: str = "user"
) -> list[int]:
    """The token ids `observation` (text, sent as a `role` message, or chat messages) adds after a model
    turn that ended with `end_of_turn_id` (default: the tokenizer's EOS), up to and including the
    generation prompt of the model's next turn."""
    end = tokenizer.eos_token_id if end_of_turn_id is None else end_of_turn_id
    before = render_chat(tokenizer, _BEFORE, add_generation_prompt=False)
    after = render_chat(tokenizer, _BEFORE + as_messages(observation, role))
    return _after_turn(before, after, end)


def observation_inputs(
    processor, observation: str | list[dict], end_of_turn_id: int, role: str = "user"
) -> tuple[list[int], dict | None]:
    """observation_ids for a vision-language policy: (the ids the observation adds, each of its images'
    placeholders expanded once by the processor; its images' inputs {pixel_values, image_grid_thw} or None).
    contract.BadImage when an image cannot be encoded."""
    from roll_lite.environments.images import encode_messages

    before, _ = encode_messages(processor, _BEFORE, add_generation_prompt=False)
    after, images = encode_messages(processor, _BEFORE + as_messages(observation, role))
    return _after_turn(before, after, end_of_turn_id), images


def _after_turn(before: list[int], after: list[int], end: int) -> list[int]:
    """What `after` (the conversation and the observation) adds past `before`'s last end-of-turn token."""
    if end not in before:
        raise TemplateError(
            f"the chat template does not end an assistant turn with the end-of-turn token (id {end}); "
            "multi-turn needs one that does, so that a sampled turn ends where the template's does"
        )
    cut = len(before) - before[::-1].index(end)  # just past the last assistant turn's end-of-turn token
    if after[:cut] != before[:cut]:
        raise TemplateError(
            "the chat template renders earlier turns differently once a message follows them "
            "(e.g. it strips <think> from history); a trajectory cannot be continued token by token"
        )
    return after[cut:]


@dataclass
class Trajectory:
    """One prompt and the turns after it, each piece as the ids it was: the engine's sampled tokens
    with their log-probs (the model's), or the tokens an observation added (the environment's)."""

    prompt_ids: list[int]
    pieces: list[tuple[list[int], list[float] | None]] = field(default_factory=list)
    # an MoE engine's experts [tokens, layers, k] (int16) of the tokens up to the last model turn (merge_routing)
    routed_experts: torch.Tensor | None = None
    # a vision-language policy's: the image inputs {pixel_values, image_grid_thw} of the prompt and of each
    # observation with images, in the order of their image tokens (environments/images.py)
    images: list[dict] = field(default_factory=list)

    def add_model_turn(self, token_ids: list[int], log_probs: list[float]) -> None:
        if len(token_ids) != len(log_probs):
            raise ValueError(f"a model turn of {len(token_ids)} tokens came with {len(log_probs)} log-probs")
        self.pieces.append((list(token_ids), list(log_probs)))

    def add_observation(self, token_ids: list[int], images: dict | None = None) -> None:
        self.pieces.append((list(token_ids), None))
        if images is not None:
            self.images.append(images)

    @property
    def image_inputs(self) -> dict | None:
        """All the trajectory's images so far, in the order of their image tokens; None: none."""
        from roll_lite.environments.images import join_image_inputs

        return join_image_inputs(self.images)

    @property
    def response_ids(self) -> list[int]:
        return [token for ids, _ in self.pieces for token in ids]

    @property
    def model_mask(self) -> list[int]:
        return [int(log_probs is not None) for ids, log_probs in self.pieces for _ in ids]

    @property
    def log_probs(self) -> list[float]:
        """The engine's log-prob of each response token; 0 for the environment's."""
        return [
            lp for ids, log_probs in self.pieces for lp in (log_probs if log_probs is not None else [0.0] * len(ids))
        ]

    def token_experts(self) -> torch.Tensor:
        """routed_experts over every token (prompt + response): -1 after the last model turn (nothing read them)."""
        assert self.routed_experts is not None
        missing = len(self.prompt_ids) + len(self.response_ids) - len(self.routed_experts)
        tail = torch.full((missing, *self.routed_experts.shape[1:]), -1, dtype=self.routed_experts.dtype)
        return torch.cat([self.routed_experts, tail])

    @property
    def num_model_turns(self) -> int:
        return sum(log_probs is not None for _, log_probs in self.pieces)


def trajectory_batch(trajectories: list[Trajectory], pad_token_id: int) -> DataProto:
    """The rows of roll_lite.data.sequences.build_sequence_batch (prompt + response, right-padded:
    input_ids, attention_mask, response_mask on every token after the prompt, rollout_log_probs) and
    model_mask: the model's sampled tokens, the loss mask (the environment's tokens get 0 there and
    0 log-prob)."""
    batch = build_sequence_batch(
        [t.prompt_ids for t in trajectories],
        [t.response_ids for t in trajectories],
        pad_token_id,
        [t.log_probs for t in trajectories],
    )
    model_mask = torch.zeros_like(batch["response_mask"])
    for row, trajectory in enumerate(trajectories):
        start = len(trajectory.prompt_ids)
        model_mask[row, start : start + len(trajectory.response_ids)] = torch.tensor(
            trajectory.model_mask, dtype=torch.long
        )
    batch.batch["model_mask"] = model_mask
    if any(t.images for t in trajectories):  # each row its trajectory's images (roll_lite/strategy/vision_inputs.py)
        batch.non_tensor_batch["image_inputs"] = [t.image_inputs for t in trajectories]
    if trajectories and all(t.routed_experts is not None for t in trajectories):  # an MoE engine's (merge_routing)
        batch.batch["routed_experts"] = token_aligned_experts(
            batch["attention_mask"], [t.token_experts() for t in trajectories]
        )
    return batch
