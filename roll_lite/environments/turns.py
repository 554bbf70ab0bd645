"""Token in, token out: a multi-turn trajectory is built from the token ids the engine sampled and the
tokens each observation adds, never by re-tokenizing the conversation's text (re-tokenized text drifts
from what was sampled: verl #6501, NeMo RL #2821, TRL #5242).

    prompt | model turn 1 (sampled) | observation 1 (chat-templated) | model turn 2 (sampled) | ...

`observation_ids` gives the tokens an observation adds after a model turn that ended with the end-of-turn
token: what the chat template puts after that token (e.g. Qwen's newline after <|im_end|>), the
observation as a user / tool message, and the generation prompt. `Trajectory` keeps the pieces apart,
so the model's tokens (model_mask: trained) and the environment's (conditioned on, never trained) are
known exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# A conversation the template renders before the observation; only what follows its last assistant
# turn's end-of-turn token is kept, so these contents never reach a trajectory.
_BEFORE = [{"role": "user", "content": "1"}, {"role": "assistant", "content": "2"}]


class TemplateError(ValueError):
    """The chat template cannot continue a conversation token by token after a model turn."""


def observation_ids(tokenizer, observation: str | list[dict], end_of_turn_id: int | None = None, role: str = "user") -> list[int]:
    """The token ids `observation` (text, sent as a `role` message, or chat messages) adds after a model
    turn that ended with `end_of_turn_id` (default: the tokenizer's EOS), up to and including the
    generation prompt of the model's next turn."""
    end = tokenizer.eos_token_id if end_of_turn_id is None else end_of_turn_id
    messages = [{"role": role, "content": observation}] if isinstance(observation, str) else list(observation)
    before = _render(tokenizer, _BEFORE, generation_prompt=False)
    after = _render(tokenizer, _BEFORE + messages, generation_prompt=True)
    if end not in before:
        raise TemplateError(f"the chat template does not end an assistant turn with the end-of-turn token (id {end}); "
                            "multi-turn needs one that does, so that a sampled turn ends where the template's does")
    cut = len(before) - before[::-1].index(end)  # just past the last assistant turn's end-of-turn token
    if after[:cut] != before[:cut]:
        raise TemplateError("the chat template renders earlier turns differently once a message follows them "
                            "(e.g. it strips <think> from history); a trajectory cannot be continued token by token")
    return after[cut:]


def _render(tokenizer, messages: list[dict], generation_prompt: bool) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=True, return_dict=False)
    return list(ids)


@dataclass
class Trajectory:
    """One prompt and the turns after it, each piece as the ids it was: the engine's sampled tokens
    with their log-probs (the model's), or the tokens an observation added (the environment's)."""

    prompt_ids: list[int]
    pieces: list[tuple[list[int], list[float] | None]] = field(default_factory=list)

    def add_model_turn(self, token_ids: list[int], log_probs: list[float]) -> None:
        if len(token_ids) != len(log_probs):
            raise ValueError(f"a model turn of {len(token_ids)} tokens came with {len(log_probs)} log-probs")
        self.pieces.append((list(token_ids), list(log_probs)))

    def add_observation(self, token_ids: list[int]) -> None:
        self.pieces.append((list(token_ids), None))

    @property
    def response_ids(self) -> list[int]:
        return [token for ids, _ in self.pieces for token in ids]

    @property
    def model_mask(self) -> list[int]:
        return [int(log_probs is not None) for ids, log_probs in self.pieces for _ in ids]

    @property
    def log_probs(self) -> list[float]:
        """The engine's log-prob of each response token; 0 for the environment's."""
        return [lp for ids, log_probs in self.pieces for lp in (log_probs if log_probs is not None else [0.0] * len(ids))]

    @property
    def num_model_turns(self) -> int:
        return sum(log_probs is not None for _, log_probs in self.pieces)


def trajectory_tensors(trajectories: list[Trajectory], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-padded rows of prompt + response: input_ids, attention_mask, response_mask (every token
    after the prompt), model_mask (the model's sampled tokens: the loss mask) and rollout_log_probs
    (the engine's, at the model's tokens; 0 elsewhere)."""
    width = max(len(t.prompt_ids) + len(t.response_ids) for t in trajectories)
    rows = len(trajectories)
    tensors = {"input_ids": torch.full((rows, width), pad_token_id, dtype=torch.long),
               "attention_mask": torch.zeros(rows, width, dtype=torch.long),
               "response_mask": torch.zeros(rows, width, dtype=torch.long),
               "model_mask": torch.zeros(rows, width, dtype=torch.long),
               "rollout_log_probs": torch.zeros(rows, width, dtype=torch.float32)}
    for row, trajectory in enumerate(trajectories):
        start, response = len(trajectory.prompt_ids), trajectory.response_ids
        end = start + len(response)
        tensors["input_ids"][row, :end] = torch.tensor(trajectory.prompt_ids + response)
        tensors["attention_mask"][row, :end] = 1
        tensors["response_mask"][row, start:end] = 1
        tensors["model_mask"][row, start:end] = torch.tensor(trajectory.model_mask)
        tensors["rollout_log_probs"][row, start:end] = torch.tensor(trajectory.log_probs)
    return tensors
