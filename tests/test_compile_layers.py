"""model.compile_layers: decoder layers compiled with inductor give eager's losses and gradients, with
and without activation checkpointing (unwrapped, and under FSDP2 on one rank), on packed micro-batches
whose length changes every step, without compiling again for each new length; parameter names stay the
HF ones; the worker compiles them when the config says so."""

import pytest
import torch

from roll_lite.config import load_config
from roll_lite.loss import ppo_policy_loss_func
from roll_lite.loss.checker import TINY_MODEL, random_rl_batch, relative_deviation
from roll_lite.model.compiling import compile_decoder_layers
from roll_lite.model.modeling import build_causal_lm, decoder_layers, enable_gradient_checkpointing
from roll_lite.strategy import FSDP2Strategy, StrategyConfig


def _train(compiled: bool, checkpointing: bool, batches, wrapped: bool = False):
    lm = build_causal_lm(TINY_MODEL, dtype=torch.float64, seed=0)
    if checkpointing:
        enable_gradient_checkpointing(lm)
    if compiled:
        compile_decoder_layers(lm)
    # one packed micro-batch of all 8 rows per step (the budget holds them), of another length each step
    # lr 0: AdamW would turn float32-sized differences of tiny gradients into lr-sized steps
    config = StrategyConfig(use_packing=True, max_tokens_per_micro_batch=1000, param_dtype="float64", lr=0.0)
    strategy = FSDP2Strategy(lm, config, shard_single_rank=wrapped)
    metrics, graphs = [], []
    for data in batches:
        step = strategy.train_step(data, ppo_policy_loss_func("token-mean"))
        metrics += [step["loss"], step["grad_norm"]]
        graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    grads = {
        name: param.grad.full_tensor() if wrapped else param.grad for name, param in strategy.model.named_parameters()
    }
    return metrics, grads, graphs


def test_compiled_layers_train_like_eager_and_compile_once_for_all_lengths():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    batches = [random_rl_batch(num_rows=8, seq_len=length, seed=length) for length in (12, 20, 16, 24)]
    assert len({int(data["attention_mask"].sum()) for data in batches}) == 4  # a new pack length every step
    eager_metrics, eager_grads, _ = _train(False, False, batches)
    for checkpointing in (False, True):  # with checkpointing under FSDP2 too (its hooks outside the compiled code)
        metrics, grads, graphs = _train(True, checkpointing, batches, wrapped=checkpointing)
        # HF's RMSNorm computes in float32 even in a float64 model, and inductor rounds that float32
        # arithmetic otherwise than eager (roll_lite/model/compiling.py): equal to float32 precision, not 1e-15
        assert metrics == pytest.approx(eager_metrics, rel=1e-6)  # each step's loss and grad norm
        assert grads.keys() == eager_grads.keys()  # no _orig_mod. in the names
        errors = {name: relative_deviation(grads[name], grad) for name, grad in eager_grads.items()}  # the last step's
        assert max(errors.values()) < 1e-6, errors
        assert graphs[0] > 0 and graphs[-1] == graphs[0], graphs  # compiled at the first step only


def test_the_worker_compiles_the_layers_when_the_config_says_so(monkeypatch):
    from test_model import _worker  # a ModelWorker set up in this process

    for compiled in (False, True):
        config = load_config(
            None, [f"model.compile_layers={compiled}", "model.dtype=float64", "actor.param_dtype=float64"]
        )
        layers = decoder_layers(_worker("actor", config, monkeypatch).strategy.model)
        assert all(hasattr(vars(layer).get("forward"), "_torchdynamo_orig_callable") == compiled for layer in layers)
