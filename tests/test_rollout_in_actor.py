"""rollout.in_actor with an engine dtype of its own (or on a GPU): the engine holds a copy of the
actor's parameters that each sync refreshes in place, device to device, with no trip through Ray's
object store. Run in one process, as the actor's worker runs it (workers/model_worker.py start_rollout)."""

import torch
from roll_lite.workers.rollout_worker import RolloutWorker

from roll_lite.config import RunConfig
from roll_lite.loss import ppo_policy_loss_func
from roll_lite.loss.checker import random_rl_batch
from roll_lite.model.modeling import load_causal_lm
from roll_lite.model.tokenizer import load_tokenizer
from roll_lite.rollout import SamplingParams
from roll_lite.strategy import FSDP2Strategy, StrategyConfig


def test_an_engine_in_its_own_dtype_follows_the_actor_in_place():
    config = RunConfig()
    config.rollout.in_actor, config.rollout.dtype = True, "bfloat16"
    vocab = len(load_tokenizer(None))
    strategy = FSDP2Strategy(load_causal_lm(config.model, vocab, seed=config.seed), StrategyConfig(lr=1e-2))
    worker = RolloutWorker(config, actor_weights=strategy.own_parameters)
    assert "a bfloat16 copy of the actor's parameters on cpu, refreshed in place each sync" in worker.describe()
    engine_tensors = worker.engine.model.state_dict()
    addresses = {name: tensor.data_ptr() for name, tensor in engine_tensors.items()}

    batch = random_rl_batch(num_rows=4, seq_len=24, vocab_size=vocab, seed=1, dtype=torch.float32)
    strategy.train_step(batch, ppo_policy_loss_func("token-mean"))
    _, stale = worker.weights()
    worker.use_actor_weights(1)
    version, synced = worker.weights()

    actor = strategy.own_parameters()
    assert version == 1 and set(synced) == set(actor)
    for name, value in actor.items():
        assert synced[name].dtype == torch.bfloat16
        assert torch.equal(synced[name], value.to(torch.bfloat16)), name  # the actor's values, cast once
    assert any(not torch.equal(stale[name], synced[name]) for name in synced)  # the step moved the weights
    assert {name: tensor.data_ptr() for name, tensor in worker.engine.model.state_dict().items()} == addresses
    assert all(actor[name].data_ptr() != address for name, address in addresses.items())  # a copy, not a view

    completions = worker.generate([[5, 6, 7], [8, 9]], SamplingParams(max_new_tokens=4, num_samples=2))
    assert completions.weight_version == 1 and len(completions.token_ids) == 4
