"""The promise under Ulysses sequence parallelism (roll_lite/strategy/sequence_parallel.py): a step's loss and
every gradient equal one forward/backward over the global batch, float64, relative error ≤ 1e-10, with
each sequence split over S ranks: S ∈ {2, 4} × D ∈ {1, 2} (D·S ≤ 4 gloo processes: D1-S2, D2-S2, D1-S4;
D2-S4 would take 8 processes on the suite's 2 cores) × A ∈ {1, 2} × padded / packed. At D1-S2 the policy
loss in every agg mode, the KL-regularised loss, per-sequence ratios (the sequence loss), the critic's value
loss (head='value'), a user's own loss_func with a per-sequence square (loss_cases.user_loss_func), the SFT,
DPO and reward-model (head='score', Bradley–Terry: each score reads one position ahead) losses, and in
one configuration each: multi-turn masks, LoRA, token-budget micro-batches, activation checkpointing (the
all-to-alls recomputed in backward) and the teacher's top-k (ids gathered per slice); at D2-S2 and D1-S4 a
smaller set (sp_cases says which), as their 4 processes cost twice as much a case. The tiny model's 4
query and 2 KV heads: at S = 2 each rank gets one KV head, at S = 4 each KV head is repeated twice.

The reference and the harness are test_exactness.py's (distributed_harness.py); the S = 1 rows are there."""

import pytest
import torch
from distributed_harness import Case, case_deviations, run_strategy
from pair_cases import PAIR_MODE, PAIR_ROWS

from roll_lite.loss import AGG_MODES


def _rows(d, s, loss, modes, grad_accum=(1, 2), micro_batchings=("padded", "packed"), **extra) -> list[Case]:
    return [
        Case(loss, mode, d, a, mb, sequence_parallel=s, **extra)
        for mode in modes
        for a in grad_accum
        for mb in micro_batchings
    ]


def sp_cases() -> list[Case]:
    # D1-S2 (2 processes, ~0.2 CPU s a case): the whole list.
    cases = _rows(1, 2, "ppo", AGG_MODES)
    cases += _rows(1, 2, "ppo_kl", ("token-mean", "seq-mean-token-mean"))
    cases += _rows(1, 2, "sequence", ("seq-mean-token-mean",), grad_accum=(2,))
    cases += _rows(1, 2, "value", ("token-mean",))
    cases += _rows(1, 2, "user", ("token-mean",))
    cases += _rows(1, 2, "multiturn_ppo_kl", ("seq-mean-token-sum",), grad_accum=(2,))
    cases += _rows(1, 2, "ppo_kl", ("seq-mean-token-mean",), grad_accum=(2,), lora=True)
    cases += _rows(1, 2, "distill_topk", ("token-mean",), grad_accum=(1,))
    cases += _rows(1, 2, "ppo_kl", ("token-mean",), grad_accum=(1,), micro_batchings=("budget",))
    cases += _rows(1, 2, "ppo_kl", ("token-mean",), grad_accum=(2,), micro_batchings=("packed",), checkpointing=True)
    # The supervised pipelines' losses: SFT's NLL, and the pair losses (both rows of a pair on one rank and in one
    # micro-batch) through the policy head (DPO) and the reward model's score head (Bradley–Terry)
    cases += _rows(1, 2, "sft", ("token-mean",))
    cases += _rows(1, 2, "dpo", (PAIR_MODE,), grad_accum=(2,), rows=PAIR_ROWS)
    cases += _rows(1, 2, "bt", (PAIR_MODE,), rows=PAIR_ROWS)
    # D2-S2 and D1-S4 (one run of 4 processes on 2 cores, ~0.4 CPU s a case): each agg mode, the critic and
    # the user's loss, on two strategy configurations (padded A1, packed A2).
    for d, s in ((2, 2), (1, 4)):
        cases += _rows(d, s, "ppo", AGG_MODES, grad_accum=(1,), micro_batchings=("padded",))
        cases += _rows(d, s, "ppo", AGG_MODES, grad_accum=(2,), micro_batchings=("packed",))
        cases += _rows(d, s, "ppo_kl", ("seq-mean-token-mean",), grad_accum=(1,), micro_batchings=("padded",))
        cases += _rows(d, s, "user", ("token-mean",), grad_accum=(1,), micro_batchings=("padded",))
        cases += _rows(d, s, "user", ("token-mean",), grad_accum=(2,), micro_batchings=("packed",))
        cases += _rows(d, s, "value", ("token-mean",), grad_accum=(2,), micro_batchings=("packed",))
        cases += _rows(d, s, "bt", (PAIR_MODE,), grad_accum=(2,), micro_batchings=("packed",), rows=PAIR_ROWS)
    return cases


CASES = sp_cases()


@pytest.fixture(scope="module")
def strategy_results():
    return run_strategy(CASES, torch.float64)


@pytest.fixture(scope="module")
def references():
    return {}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_sequence_parallel_step_equals_global_forward_backward(case, strategy_results, references):
    loss_error, grad_error = case_deviations(case, strategy_results, references)
    assert loss_error <= 1e-10 and grad_error <= 1e-10, (loss_error, grad_error)
