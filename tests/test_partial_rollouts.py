"""roll_lite/rollout/partial.py: cohorts advanced a few tokens at a time across weight versions, each
token tagged with the version that sampled it (a scripted engine), and a fresh cohort's whole advance
being exactly the lockstep generate call (the real hf engine, bit for bit)."""

import json

import pytest
import torch

from roll_lite.rollout import Completions, HFEngine, SamplingParams
from roll_lite.rollout.partial import PartialRollouts

EOS = 0


class ScriptedEngine:
    """Each row's next token is a function of its whole prefix (so a prompt's samples are alike), and a
    row resubmitted with its tokens so far continues exactly as an uninterrupted one would; the
    log-prob says which weights sampled."""

    def __init__(self, version: int = 0):
        self.version = version
        self.calls: list[tuple[list[list[int]], int, int]] = []

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Completions:
        self.calls.append(([list(p) for p in prompts], params.max_new_tokens, params.num_samples))
        rows, log_probs = [], []
        for prompt in prompts:
            for _ in range(params.num_samples):
                row = list(prompt)
                for _ in range(params.max_new_tokens):
                    token = (sum(row) * 6 + len(row)) % 11  # 0 is EOS: rows of 6 (no EOS), 2 and 5 tokens
                    row.append(token)
                    if token == EOS:
                        break
                new = row[len(prompt) :]
                rows.append(new)
                log_probs.append([-float(self.version)] * len(new))
        return Completions(rows, log_probs)


PARAMS = SamplingParams(max_new_tokens=6, num_samples=2, temperature=1.0)
PROMPTS = [[3, 1], [4], [2, 2, 2]]


def whole(engine_version: int = 0) -> Completions:
    return ScriptedEngine(engine_version).generate(PROMPTS, PARAMS)


def test_a_fresh_cohort_advanced_to_its_end_is_one_lockstep_generate_call():
    partial, engine = PartialRollouts(EOS), ScriptedEngine()
    partial.admit(1, PROMPTS, PARAMS, "continue")
    assert partial.advance(1, None, 0, engine.generate) == 1
    assert engine.calls == [(PROMPTS, 6, 2)]
    taken = partial.take(1)
    assert taken.token_ids == whole().token_ids and taken.weight_version == 0
    assert taken.token_versions == [[0] * len(row) for row in taken.token_ids]
    assert 1 not in partial.cohorts


def test_continue_goes_on_under_new_weights_from_the_tokens_so_far():
    partial, engine = PartialRollouts(EOS), ScriptedEngine(version=3)
    partial.admit(7, PROMPTS, PARAMS, "continue")
    partial.advance(7, 2, 3, engine.generate)
    engine.version = 4
    partial.advance(7, 2, 4, engine.generate)
    # the second call resubmits only the rows still in flight, each its prompt + its tokens so far
    assert engine.calls[1][1:] == (2, 1)
    assert len(engine.calls[1][0]) == sum(1 for row in whole().token_ids if len(row) > 2)
    engine.version = 5
    assert partial.advance(7, None, 5, engine.generate) == 1
    assert partial.advance(7, None, 5, engine.generate) == 0  # finished: no call
    taken = partial.take(7)
    assert taken.token_ids == whole().token_ids  # the scripted continuation is the uninterrupted one
    for row, versions, log_probs in zip(taken.token_ids, taken.token_versions, taken.log_probs):
        assert len(versions) == len(row) == len(log_probs) <= PARAMS.max_new_tokens
        assert versions == sorted(versions) and versions[: min(2, len(row))] == [3] * min(2, len(row))
        assert log_probs == [-float(v) for v in versions]  # each token's log-prob under its own weights
    assert taken.weight_version == 3 and any(len(set(v)) > 1 for v in taken.token_versions)


def test_a_row_cut_to_its_max_new_tokens_when_it_runs_with_longer_rows():
    partial = PartialRollouts(eos_token_id=99)  # never sampled: every row runs to max_new_tokens
    partial.admit(1, [[1], [2]], SamplingParams(max_new_tokens=5, num_samples=1), "continue")
    partial.advance(1, 2, 0, ScriptedEngine().generate)
    partial.cohorts[1].rows[1].tokens.append(1)  # one row a token ahead of the other
    partial.cohorts[1].rows[1].log_probs.append(0.0)
    partial.cohorts[1].rows[1].versions.append(0)
    partial.advance(1, None, 1, ScriptedEngine(1).generate)
    taken = partial.take(1)
    assert [len(row) for row in taken.token_ids] == [5, 5]


def test_drop_starts_the_rows_in_flight_again_under_the_new_weights_and_counts_what_it_threw_away():
    partial, engine = PartialRollouts(EOS), ScriptedEngine(version=0)
    partial.admit(2, PROMPTS, PARAMS, "drop")
    partial.advance(2, 2, 0, engine.generate)
    in_flight = sum(len(row.tokens) for row in partial.cohorts[2].rows if not row.done)
    ended = [row.tokens for row in partial.cohorts[2].rows if row.done]
    engine.version = 1
    partial.advance(2, None, 1, engine.generate)
    taken = partial.take(2)
    assert taken.dropped_tokens == in_flight > 0
    assert taken.token_ids == whole().token_ids
    for row, versions in zip(taken.token_ids, taken.token_versions):
        assert set(versions) == ({0} if row in ended else {1})


def test_the_state_survives_json_and_continues_the_same():
    engine = ScriptedEngine(version=1)
    partial = PartialRollouts(EOS)
    partial.admit(3, PROMPTS, PARAMS, "continue")
    partial.advance(3, 3, 1, engine.generate)
    restored = PartialRollouts(EOS)
    restored.load_state_dict(json.loads(json.dumps(partial.state_dict())))
    for p in (partial, restored):
        p.advance(3, None, 2, ScriptedEngine(2).generate)
    assert vars(partial.take(3)) == vars(restored.take(3))


def test_misuse_is_named():
    partial = PartialRollouts(EOS)
    partial.admit(1, PROMPTS, PARAMS, "continue")
    with pytest.raises(RuntimeError, match="cohort 1 was admitted twice"):
        partial.admit(1, PROMPTS, PARAMS, "continue")
    with pytest.raises(RuntimeError, match=r"cohort 1 is not finished \(0/6 rows ended, 0 tokens\)"):
        partial.take(1)
    with pytest.raises(RuntimeError, match=r"no cohort 2 in flight \(in flight: \[1\]\)"):
        partial.advance(2, None, 0, ScriptedEngine().generate)
    with pytest.raises(ValueError, match="on_update must be one of continue, drop, got 'finish'"):
        partial.admit(2, PROMPTS, PARAMS, "finish")


def test_with_the_hf_engine_a_fresh_cohort_is_the_lockstep_call_bit_for_bit_and_segments_keep_their_log_probs():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    model = LlamaForCausalLM(config)
    params = SamplingParams(max_new_tokens=8, num_samples=3, temperature=1.0)
    prompts = [[5, 6, 7], [9, 3]]
    lockstep = HFEngine(model, pad_token_id=1, eos_token_id=2, seed=11).generate(prompts, params)
    partial = PartialRollouts(eos_token_id=2)
    engine = HFEngine(model, pad_token_id=1, eos_token_id=2, seed=11)
    partial.admit(1, prompts, params, "continue")
    partial.advance(1, None, 0, engine.generate)
    assert vars(partial.take(1)) | {"token_versions": None} == vars(lockstep) | {"weight_version": 0}

    partial.admit(2, prompts, params, "continue")
    for _ in range(4):
        partial.advance(2, 2, 0, engine.generate)
    taken = partial.take(2)
    assert all(1 <= len(row) <= 8 for row in taken.token_ids)
    # each token's log-prob is the model's own for that token after its prefix (one forward to check)
    for prompt_index, row, log_probs in zip([0, 0, 0, 1, 1, 1], taken.token_ids, taken.log_probs):
        ids = torch.tensor([prompts[prompt_index] + row])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompts[prompt_index]) - 1 : -1]
        expected = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(row)[:, None]).squeeze(1)
        assert torch.allclose(torch.tensor(log_probs), expected, atol=1e-5)


def test_the_batch_carries_each_response_tokens_weight_version_beside_its_log_prob():
    from types import SimpleNamespace

    from roll_lite.data.prompts import PromptData
    from roll_lite.data.sequences import completion_batch

    partial, engine = PartialRollouts(EOS), ScriptedEngine(version=3)
    partial.admit(1, PROMPTS, PARAMS, "continue")
    partial.advance(1, 2, 3, engine.generate)
    engine.version = 4
    partial.advance(1, None, 4, engine.generate)
    taken = partial.take(1)
    tokenizer = SimpleNamespace(pad_token_id=99, decode=lambda ids, skip_special_tokens: str(ids))
    prompts = PromptData(PROMPTS, ["a", "b", "c"], ["", "", ""], [{}, {}, {}])
    batch = completion_batch(prompts, taken, tokenizer)
    mask = batch["response_mask"].bool()
    assert torch.equal(batch["rollout_versions"] >= 0, mask)
    assert batch["rollout_versions"][mask].tolist() == [v for row in taken.token_versions for v in row]
    assert batch["rollout_log_probs"][mask].tolist() == [-float(v) for row in taken.token_versions for v in row]
