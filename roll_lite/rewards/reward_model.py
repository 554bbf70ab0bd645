"""A reward model: a transformers sequence-classification model from a local folder (one label: one
score per sequence), scoring each response with its own tokenizer and chat template.

How it sees the text (`describe` says which, at start-up):
- the policy's tokenizer is the reward model's own (same vocabulary, special tokens and chat
  template): the policy's token ids (prompt + response) go straight in;
- otherwise the conversation is rebuilt from text, the prompt (a string, or the data's chat
  messages) and the decoded response, and rendered with the reward model's chat template (or, without
  one, prompt + response as plain text), then tokenized by the reward model's tokenizer.

Batches are length-sorted and hold at most `max_tokens` padded tokens (a longer sequence alone).
A batch whose forward raises costs its rows (`failed`, with the reason), never the run; so does a
non-finite score or a sequence longer than the model's positions. `normalize` standardises the
batch's scores (over the rows scored), `clip` bounds them to [-clip, clip] after that.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, cast

import torch

from roll_lite.data.chat import text_messages
from roll_lite.rewards.calls import describe
from roll_lite.rewards.outcomes import Score, failed, scored, timed_out


def folder_label(path: str) -> str:
    """A source's name in its metrics: its folder's name, or for a run's final/ the run's
    (outputs/rm_increment/final -> rm_increment)."""
    folder = Path(path).expanduser().resolve()
    return folder.parent.name if folder.name == "final" and folder.parent.name else folder.name


def model_metric_name(path: str) -> str:
    """reward/<this>: the model's folder_label."""
    return f"model:{folder_label(path)}"


def check_reward_model_folder(path: str, key: str) -> None:
    """Before the run: a local folder holding a one-label sequence-classification model and a tokenizer."""
    from roll_lite.model.files import local_model

    config, tokenizer = local_model(
        path, key, "a reward model", "AutoModelForSequenceClassification", "a sequence-classification one"
    )
    if config.num_labels != 1:
        raise ValueError(
            f"{key}: '{path}' has a head of {config.num_labels} labels; a reward model gives one score per "
            "sequence (num_labels=1)"
        )
    if tokenizer.pad_token_id is None:
        raise ValueError(
            f"{key}: the tokenizer of '{path}' has no pad token, which batching needs (set one and save it again)"
        )


class RewardModel:
    def __init__(
        self,
        path: str,
        policy_tokenizer,
        max_tokens: int = 4096,
        normalize: bool = False,
        clip: float | None = None,
        device: str = "cpu",
        timeout_s: float | None = None,
    ):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.path, self.max_tokens, self.normalize, self.clip = path, max_tokens, normalize, clip
        self.timeout_s = timeout_s
        folder = Path(path).expanduser()
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForSequenceClassification.from_pretrained(folder).to(device).eval()
        if self.tokenizer.pad_token_id is None:
            raise ValueError(f"reward.models: '{path}': its tokenizer has no pad token (set one and save it again)")
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.same_tokenizer = _same_tokenizer(self.tokenizer, policy_tokenizer)
        self.positions = getattr(self.model.config, "max_position_embeddings", None)

    def describe(self) -> str:
        how = (
            "the policy's token ids go straight in (same tokenizer and chat template)"
            if self.same_tokenizer
            else "the conversation is decoded and rendered with its own "
            + ("chat template" if self.tokenizer.chat_template else "tokenizer (no chat template: prompt + response)")
        )
        limit = f", batches after {self.timeout_s:g} s timed out" if self.timeout_s is not None else ""
        return f"reward model {self.path}: {how}{limit}"

    def score(self, prompts: list[Any], responses: list[str], sequences: list[list[int]]) -> list[Score]:
        inputs = sequences if self.same_tokenizer else [self._render(p, r) for p, r in zip(prompts, responses)]
        results: list[Score | None] = [None] * len(inputs)
        for index, ids in enumerate(inputs):
            if self.positions is not None and len(ids) > self.positions:
                results[index] = failed(f"{len(ids)} tokens, more than the reward model's {self.positions} positions")
        pending = sorted((i for i, r in enumerate(results) if r is None), key=lambda i: len(inputs[i]))
        start = time.monotonic()
        for rows in self._batches(pending, inputs):
            if self.timeout_s is not None and time.monotonic() - start > self.timeout_s:
                for i in rows:  # a batch under way finishes; the batches after the limit are not started
                    results[i] = timed_out(
                        f"reward model {self.path}: not reached within reward.model_timeout_s={self.timeout_s:g} s"
                    )
                continue
            try:
                values = self._forward([inputs[i] for i in rows])
            except Exception as error:  # the batch's rows fail; the next batch goes on
                reason = describe(error)
                for i in rows:
                    results[i] = failed(f"reward model forward: {reason}")
                continue
            for i, value in zip(rows, values):
                results[i] = scored(value) if math.isfinite(value) else failed(f"the reward model gave {value}")
        return self._standardised(cast("list[Score]", results))  # cast: each row is scored or failed by now

    def _render(self, prompt: Any, response: str) -> list[int]:
        # chat messages read as text: an image part is `<image>` (content_text; the reward model reads no images)
        messages = text_messages(prompt) if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
        if self.tokenizer.chat_template:
            conversation = [*messages, {"role": "assistant", "content": response}]
            return list(self.tokenizer.apply_chat_template(conversation, tokenize=True, return_dict=False))
        text = "".join(m["content"] for m in messages) + response
        return self.tokenizer(text, add_special_tokens=True)["input_ids"]

    def _batches(self, rows: list[int], inputs: list[list[int]]):
        batch: list[int] = []
        for i in rows:  # sorted by length: a batch's padded size is its count × its last row's length
            if batch and (len(batch) + 1) * len(inputs[i]) > self.max_tokens:
                yield batch
                batch = []
            batch.append(i)
        if batch:
            yield batch

    @torch.no_grad()
    def _forward(self, sequences: list[list[int]]) -> list[float]:
        width = max(len(ids) for ids in sequences)
        input_ids = torch.full((len(sequences), width), self.tokenizer.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for row, ids in enumerate(sequences):  # right padding: the head reads each row's last real token
            input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, : len(ids)] = 1
        device = next(self.model.parameters()).device
        logits = self.model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device)).logits
        return logits[:, 0].float().cpu().tolist()

    def _standardised(self, results: list[Score]) -> list[Score]:
        values = torch.tensor([r.value for r in results if r.ok], dtype=torch.float64)
        if self.normalize and len(values) > 1:
            mean, std = values.mean(), values.std()
            results = [scored(float((r.value - mean) / (std + 1e-6))) if r.ok else r for r in results]
        if self.clip is not None:
            results = [scored(max(-self.clip, min(self.clip, r.value))) if r.ok else r for r in results]
        return results


def _same_tokenizer(a, b) -> bool:
    same_specials = all(
        getattr(a, f"{name}_token_id") == getattr(b, f"{name}_token_id") for name in ("bos", "eos", "pad")
    )
    return same_specials and a.chat_template == b.chat_template and a.get_vocab() == b.get_vocab()
