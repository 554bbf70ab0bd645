"""What no kernel variable of `reproducible=portable` pins, MKL's vector math sqrt, a portable run does
not use: GRPO's group std is the float64 sqrt rounded to float32 (exact_sqrt), and the model workers
train with fused AdamW (tests/test_reproducibility.py: the variables themselves, in every process)."""

import math

import numpy as np
import torch

from roll_lite.config import load_config
from roll_lite.loss.advantages import _group_statistics, exact_sqrt


def test_exact_sqrt_is_the_correctly_rounded_float32_sqrt():
    x = torch.arange(0x3F800000, 0x40800000, dtype=torch.int32).view(torch.float32)  # every float32 in [1, 4)
    expected = np.sqrt(x.numpy().astype(np.float64)).astype(np.float32)  # numpy: the CPU's sqrt instruction
    assert np.array_equal(exact_sqrt(x).numpy(), expected)
    assert exact_sqrt(torch.tensor([0.0, 4.0, 2.0], dtype=torch.float64)).tolist() == [0.0, 2.0, math.sqrt(2.0)]
    # float64 too: torch.sqrt is one ulp off for 0.7 % of these on an Intel Xeon (AVX-512)
    y = torch.rand(20000, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 100
    assert exact_sqrt(y).tolist() == [math.sqrt(v) for v in y.tolist()]


def test_grpo_group_std_is_the_float64_sqrt_rounded_to_float32_bit_for_bit():
    scores = torch.rand(4096, generator=torch.Generator().manual_seed(0))
    group_ids = torch.arange(512).repeat_interleave(8)
    inverse, counts, _, means, stds = _group_statistics(scores, group_ids)
    squares = torch.zeros(512).index_add_(0, inverse, (scores - means[inverse]) ** 2)
    variances = squares / (counts - 1)  # the float32 variances _group_statistics takes the sqrt of
    expected = torch.tensor([math.sqrt(v) for v in variances.tolist()], dtype=torch.float32)
    assert torch.equal(stds, expected)


def test_a_portable_runs_model_workers_train_with_fused_adamw():
    from roll_lite.workers.model_worker import strategy_config

    from roll_lite.loss.checker import TINY_MODEL
    from roll_lite.model.modeling import build_causal_lm
    from roll_lite.strategy import FSDP2Strategy, StrategyConfig

    for setting, fused in (("machine", False), ("portable", True)):
        config = load_config(None, [f"reproducible={setting}"])
        assert [strategy_config(config, role).adamw_fused for role in ("actor", "critic")] == [fused, fused]
        assert not config.actor.adamw_fused  # the run's config itself is left as it was
    for fused, kernel in ((False, (None, True)), (True, (True, None))):
        strategy = FSDP2Strategy(build_causal_lm(TINY_MODEL, seed=0), StrategyConfig(adamw_fused=fused))
        assert (strategy.optimizer.defaults["fused"], strategy.optimizer.defaults["foreach"]) == kernel
