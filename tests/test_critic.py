"""The critic (head='value') under FSDP2: its forward returns no view, so FSDP2 does not warn.

FSDP2 warns when a wrapped module's forward returns a view tensor (an in-place op on it would skip
the pre-backward all-gather). The train step runs in a spawned process: the strategy creates a
one-process default group there, which must not leak into this test process.
"""

import os
import tempfile
import warnings

import torch
import torch.multiprocessing as mp

from roll_lite.loss import value_loss_func
from roll_lite.loss.checker import TINY_MODEL, random_rl_batch
from roll_lite.model.modeling import CausalLMWithValueHead, build_causal_lm
from roll_lite.strategy.distributed import close_distributed


def _critic_step(rank: int, out_path: str):
    for name in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(name, None)  # the strategy's own one-process group
    torch.set_num_threads(1)
    from roll_lite.strategy import FSDP2Strategy, StrategyConfig

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = StrategyConfig(grad_accum_steps=2, param_dtype="float32", lr=1e-3)
        strategy = FSDP2Strategy(build_causal_lm(TINY_MODEL, dtype=torch.float32, seed=0), config, head="value")
        data = random_rl_batch(num_rows=6, seq_len=12, seed=3, dtype=torch.float32)
        metrics = strategy.train_step(data, value_loss_func())
        values = strategy.compute_values(data)["values"]
    torch.save(([str(w.message) for w in caught], metrics, values), out_path)
    close_distributed()


def test_fsdp2_critic_train_step_emits_no_view_warning():
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "critic.pt")
        mp.spawn(_critic_step, args=(out_path,), nprocs=1, join=True)
        messages, metrics, values = torch.load(out_path, weights_only=False)
    view_warnings = [m for m in messages if "view" in m]
    assert not view_warnings, view_warnings
    # The step did happen: a finite value loss, and the zero-initialised head moved off zero.
    assert torch.isfinite(torch.tensor(metrics["vf_loss"])) and metrics["vf_loss"] > 0
    assert metrics["grad_norm"] > 0 and values.abs().max() > 0


def test_value_head_returns_a_fresh_tensor_with_the_head_applied_to_the_hidden_states():
    lm = build_causal_lm(TINY_MODEL, dtype=torch.float64, seed=0)
    model = CausalLMWithValueHead(lm)
    torch.nn.init.normal_(model.value_head.weight, generator=torch.Generator().manual_seed(1))
    input_ids = torch.randint(1, 64, (2, 5), generator=torch.Generator().manual_seed(2))
    position_ids = torch.arange(5).expand(2, 5)
    values = model(input_ids, position_ids)["values"]
    assert values._base is None and values.shape == (2, 5)
    hidden = lm.model(input_ids=input_ids, use_cache=False).last_hidden_state
    expected = hidden @ model.value_head.weight.detach()[0] + model.value_head.bias.detach()[0]
    torch.testing.assert_close(values.detach(), expected.detach(), rtol=1e-12, atol=1e-12)
