"""Worst relative error of the step's loss and gradients vs one global forward/backward, per agg
mode, model and dtype, over the whole test matrix (actor: 3 policy losses and, token-mean, the SFT loss; critic: the value loss
through FSDP2Strategy(head='value'); the pair losses: a reward model's Bradley–Terry through
FSDP2Strategy(head='score'), and DPO, IPO, SimPO; on-policy distillation's reverse KL and top-k forward KL; D ∈ {1,2} × A ∈ {1,2,3} × padded/packed, plus token-budget
micro-batches and one-row batches that leave a rank empty), with the real FSDP2 strategy on gloo ranks.

    python benchmarks/exactness.py

float32 runs are compared with a float64 reference from the same initial weights.
"""

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from distributed_harness import all_cases, deviations, reference, run_strategy  # noqa: E402
from loss_cases import CRITIC_LOSSES  # noqa: E402
from pair_cases import PAIR_LOSSES, PAIR_MODE  # noqa: E402

from roll_lite.loss import AGG_MODES  # noqa: E402

MODELS = (
    "actor",
    "actor (LoRA)",
    "critic",
    "reward model (Bradley–Terry)",
    "policy (DPO, IPO, SimPO)",
    "student (distillation: reverse KL, top-k forward KL)",
)


def model_of(case) -> str:
    if case.loss in PAIR_LOSSES:
        return MODELS[3] if case.loss == "bt" else MODELS[4]
    if case.loss in ("distill_rkl", "distill_topk"):
        return MODELS[5]
    return "critic" if case.loss in CRITIC_LOSSES else "actor (LoRA)" if case.lora else "actor"


def main():
    cases = all_cases()
    rows = []
    for dtype in (torch.float64, torch.float32):
        start = time.perf_counter()
        results = run_strategy(cases, dtype)
        keys = {(c.loss, c.mode, c.rows, c.lora) for c in cases}
        references = {key: reference(key[0], key[1], dtype, key[2], key[3]) for key in keys}
        for mode in (*AGG_MODES, PAIR_MODE):
            for model in MODELS:
                selected = [c for c in cases if c.mode == mode and model_of(c) == model]
                if not selected:
                    continue
                errors = [deviations(results[c], references[(c.loss, c.mode, c.rows, c.lora)]) for c in selected]
                rows.append(
                    (
                        str(dtype).removeprefix("torch."),
                        mode,
                        model,
                        max(e[0] for e in errors),
                        max(e[1] for e in errors),
                        len(errors),
                    )
                )
        print(f"{dtype}: {len(cases)} cases in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    print("| dtype | agg mode | model | worst loss rel. err | worst grad rel. err | cases |")
    print("|---|---|---|---|---|---|")
    for dtype, mode, model, loss_err, grad_err, n in rows:
        print(f"| {dtype} | {mode} | {model} | {loss_err:.1e} | {grad_err:.1e} | {n} |")


if __name__ == "__main__":
    main()
