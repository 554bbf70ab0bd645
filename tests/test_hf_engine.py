"""The hf rollout engine (roll_lite/rollout/hf.py) as the rollout correction reads it: the log-prob of
every sampled token (log softmax(logits / T), before top-k / top-p, without the model folder's
repetition penalty), none with greedy decoding, and the actor's weights shared with it (rollout.in_actor),
bound again only when they are other tensors."""

import pytest
import torch

from roll_lite.loss.checker import TINY_MODEL
from roll_lite.model.modeling import build_causal_lm
from roll_lite.rollout import HFEngine, SamplingParams


@pytest.mark.parametrize(
    "params",
    [SamplingParams(12, num_samples=3), SamplingParams(12, num_samples=2, temperature=0.7, top_k=5, top_p=0.9)],
)
def test_the_hf_engine_returns_the_log_prob_of_every_sampled_token(params):
    """Against a teacher-forced forward of the same model: log softmax(logits / T) at each sampled
    token, before top-k / top-p. The model's generation_config asks for a repetition penalty, which
    a model folder can do: the engine must not apply it."""
    torch.manual_seed(0)
    model = build_causal_lm(dict(TINY_MODEL, vocab_size=40), seed=1)
    model.generation_config.repetition_penalty = 3.0
    engine = HFEngine(model, pad_token_id=0, eos_token_id=1, seed=3)
    prompts = [[5, 6, 7], [8, 9]]
    out = engine.generate(prompts, params)
    assert len(out.token_ids) == len(out.log_probs) == len(prompts) * params.num_samples
    assert any(ids[-1] != 1 for ids in out.token_ids)  # rows that ran to max_new_tokens
    if params.temperature == 1.0:
        assert any(len(ids) < 12 for ids in out.token_ids)  # and rows that stopped at EOS, padded by transformers
        # a sampled token that happens to be the pad id stays: it is part of what was sampled (and scored below)
        assert any(0 in ids and len(ids) == 12 for ids in out.token_ids)
    for row, (ids, log_probs) in enumerate(zip(out.token_ids, out.log_probs)):
        prompt = prompts[row // params.num_samples]
        sequence = torch.tensor([prompt + ids])
        with torch.no_grad():
            logits = model(input_ids=sequence).logits[0, len(prompt) - 1 : -1].float()
        expected = torch.log_softmax(logits / params.temperature, -1).gather(1, torch.tensor(ids)[:, None]).squeeze(1)
        assert len(log_probs) == len(ids)
        assert torch.allclose(torch.tensor(log_probs), expected, atol=1e-5), row


def test_shared_weights_are_bound_again_only_when_they_are_other_tensors():
    model = build_causal_lm(dict(TINY_MODEL, vocab_size=40), seed=1)
    engine = HFEngine(build_causal_lm(dict(TINY_MODEL, vocab_size=40), seed=2), pad_token_id=0, eos_token_id=1)
    own = {name: p.detach() for name, p in model.state_dict().items()}
    engine.share_weights(own)
    bound = dict(engine.model.named_parameters())
    engine.share_weights({name: t for name, t in model.state_dict().items()})  # the same tensors again: nothing to do
    assert all(p is bound[name] for name, p in engine.model.named_parameters())
    with torch.no_grad():  # an in-place update (the optimizer's) shows in the engine
        model.model.norm.weight.add_(1.0)
    assert torch.equal(engine.model.model.norm.weight, model.model.norm.weight)
    other = {name: t.clone() for name, t in own.items()}
    engine.share_weights(other)
    assert engine.model.model.norm.weight.data_ptr() == other["model.norm.weight"].data_ptr()


def test_greedy_decoding_returns_no_log_probs():
    model = build_causal_lm(dict(TINY_MODEL, vocab_size=40), seed=1)
    out = HFEngine(model, pad_token_id=0, eos_token_id=1).generate([[5, 6]], SamplingParams(4, greedy=True))
    assert out.log_probs is None and len(out.token_ids) == 1


def test_evaluation_calls_leave_the_training_samples_as_they_were():
    """Seeds count per stream (SamplingParams.stream): how often a run evaluates, greedy or sampled,
    does not change what its training calls sample; and a train-only state_dict still loads."""
    model = build_causal_lm(dict(TINY_MODEL, vocab_size=40), seed=2)
    prompts, sampled = [[5, 6], [7, 8, 9]], SamplingParams(6, num_samples=3)

    def train_samples(evals_between: int) -> list:
        engine = HFEngine(model, pad_token_id=0, eos_token_id=1, seed=4)
        samples = [engine.generate(prompts, sampled).token_ids]
        for _ in range(evals_between):
            engine.generate(prompts, SamplingParams(6, greedy=True, stream="eval"))
            engine.generate(prompts, SamplingParams(6, num_samples=2, stream="eval"))
        samples.append(engine.generate(prompts, sampled).token_ids)
        assert engine.state_dict() == {"seed": 4, "calls": 2, "eval_calls": 2 * evals_between}
        return samples

    plain = train_samples(0)
    assert train_samples(3) == plain and plain[0] != plain[1]
    resumed = HFEngine(model, pad_token_id=0, eos_token_id=1)
    resumed.load_state_dict({"seed": 4, "calls": 1})  # a checkpoint written before eval_calls existed
    assert resumed.generate(prompts, sampled).token_ids == plain[1]
    with pytest.raises(ValueError, match="SamplingParams.stream: 'test' is not one of train, eval"):
        SamplingParams(6, stream="test")
