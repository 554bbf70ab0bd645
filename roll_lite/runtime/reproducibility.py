"""`reproducible`: which CPU kernels every process of a run computes with, and so on which machines
its numbers repeat bit for bit.

torch's own kernels (ATen), MKL (float32 matmuls) and oneDNN (convolutions and some other ops) each
pick a code path by the instruction set of the CPU they run on; AVX2 and AVX-512 paths sum in other
orders and round differently, and over a run those last bits grow into another trajectory.

    machine   (default) each machine's fastest kernels: a run repeats bit for bit on machines that
              pick the same ones (same CPU type, torch / MKL build and thread counts)
    portable  one set of kernels that every x86-64 CPU with AVX2 runs alike, pinned by
              ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2 and MKL_CBWR=COMPATIBLE

MKL: its conditional numerical reproducibility (CNR) branch AVX2 promises equal results only on Intel
CPUs; on any other CPU MKL ignores it and runs its AUTO branch (on an AMD EPYC, MKL_VERBOSE=1 prints
`CNR:AUTO` for MKL_CBWR=AVX2). COMPATIBLE (SSE2, without the approximate rcpps / rsqrtps, whose
results differ between CPU makers) is the one branch documented for Intel and other CPUs alike, at the
speed of SSE2. Its `,STRICT` (the same results whatever the thread count) exists only for the
AVX2 / AVX-512 branches; the config fixes the thread counts instead (workers.torch_threads, the
driver's one thread).

Not pinned by any variable: MKL's vector math (VM), which torch runs for sqrt, exp, log, sin, cos,
tanh and erf of float32 CPU tensors. On this project's AMD EPYC (AVX-512) neither MKL_CBWR nor
MKL_ENABLE_INSTRUCTIONS changes its results. Its sqrt is one ulp off for about one value in five, at
other values under qemu's emulated AVX2-only CPUs (Intel Haswell, AMD EPYC-Rome, which agree with each
other) than here; its exp, log, sin, cos, tanh and erf agreed with them on 200,000 random values. So a
portable run computes no sqrt through it: AdamW runs its fused kernel (StrategyConfig.adamw_fused, set
by the model workers, workers/model_worker.py; foreach AdamW's sqrt is VM's), whose sqrt is the CPU's
exact one, and GRPO's group std takes the CPU's sqrt instruction through numpy (roll_lite/loss/
advantages.py exact_sqrt, in every setting; on an Intel Xeon torch's float64 sqrt is an ulp off too).
A custom loss calling torch.sqrt on float32 CPU tensors brings VM's sqrt back.
kernel_fingerprint() covers the ops a portable run uses (a fused AdamW step included);
benchmarks/determinism.py --emulate compares a training under qemu's CPUs with this one's.

The libraries read these variables once, when they first compute, so they must be in a process's
environment before torch computes anything. roll-train sets them in the driver before any torch op
(pin_kernels); a local Ray cluster, its workers and the guarded reward process inherit them; a joined
cluster's workers get them from the job's runtime_env (workers/cluster.py); each worker checks what it
got (check_kernels). For processes you start yourself:

    eval "$(python -m roll_lite.runtime.reproducibility portable)"     # prints the export lines
    python -m roll_lite.runtime.reproducibility --fingerprint          # compare it between two machines
"""

from __future__ import annotations

import hashlib
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SETTINGS: dict[str, dict[str, str]] = {
    "machine": {},
    "portable": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "COMPATIBLE"},
}
ATEN_KERNELS = {"portable": "AVX2"}  # what torch.backends.cpu.get_cpu_capability() must say
KERNEL_VARIABLES = sorted({name for env in SETTINGS.values() for name in env} | {"MKL_ENABLE_INSTRUCTIONS"})


def kernel_env(setting: str) -> dict[str, str]:
    """The environment variables `setting` pins (none for machine)."""
    if setting not in SETTINGS:
        raise ValueError(f"reproducible: '{setting}' is not one of {', '.join(SETTINGS)}")
    return dict(SETTINGS[setting])


def _same(a: str | None, b: str | None) -> bool:
    return (a or "").strip().upper() == (b or "").strip().upper()


def pin_kernels(setting: str) -> str:
    """In the driver, before torch computes anything: put `setting`'s variables into this process's
    environment, where Ray and child processes started later inherit them, and check that torch took
    them. A variable the environment already sets to another value is an error, not overridden: the
    user asked for two different kernels. Returns a line for the log."""
    from roll_lite.errors import ConfigError

    for name, value in kernel_env(setting).items():
        if name in os.environ and not _same(os.environ[name], value):
            raise ConfigError(
                f"reproducible: {setting} sets {name}={value}, but the environment has "
                f"{name}={os.environ[name]}; unset it, or set reproducible=machine to keep it"
            )
        os.environ[name] = value
    try:
        check_kernels(setting)
    except RuntimeError as error:
        raise ConfigError(str(error)) from None
    return describe(setting)


def check_kernels(setting: str) -> None:
    """In any process of a run: raise RuntimeError when it does not compute with `setting`'s kernels."""
    import torch

    wanted = kernel_env(setting)
    missing = [f"{name}={value}" for name, value in wanted.items() if not _same(os.environ.get(name), value)]
    if missing:
        raise RuntimeError(
            f"reproducible={setting}: process {os.getpid()} runs without {', '.join(missing)} in its environment"
        )
    aten = torch.backends.cpu.get_cpu_capability()
    if setting in ATEN_KERNELS and aten != ATEN_KERNELS[setting]:
        raise RuntimeError(
            f"reproducible={setting}: torch computes with its {aten} kernels here, not {ATEN_KERNELS[setting]}: "
            f"this CPU lacks {ATEN_KERNELS[setting]}, or torch computed something in this process before "
            f"ATEN_CPU_CAPABILITY was set (start Python with the variables set: "
            f'eval "$(python -m roll_lite.runtime.reproducibility {setting})")'
        )


def describe(setting: str) -> str:
    import torch

    aten = torch.backends.cpu.get_cpu_capability()
    pinned = kernel_env(setting)
    if pinned:
        variables = " ".join(f"{name}={value}" for name, value in pinned.items())
        return f"reproducible={setting}: {variables} in the driver and every worker (torch's kernels here: {aten})"
    inherited = " ".join(f"{name}={os.environ[name]}" for name in KERNEL_VARIABLES if name in os.environ)
    return (
        f"reproducible={setting}: this machine's kernels (torch's: {aten}"
        f"{'; from the environment: ' + inherited if inherited else ''}); reproducible=portable "
        "repeats the run bit for bit on other x86-64 CPUs"
    )


# torch.optim.AdamW(lr=1e-2, fused=True)'s settings, as its step() passes them to the kernel
FUSED_ADAMW = dict(amsgrad=False, lr=1e-2, beta1=0.9, beta2=0.999, weight_decay=1e-2, eps=1e-8, maximize=False)


def fused_adamw_steps(start: torch.Tensor, grad: torch.Tensor, steps: int) -> torch.Tensor:
    """The weights after `steps` steps of torch.optim.AdamW(lr=1e-2, fused=True) from `start` with the
    gradient `grad` each time: its kernel called as step() calls it, without torch.optim, whose first use
    imports torch._dynamo (~1 s of CPU; ~7 s under qemu). tests/test_reproducibility.py compares the two."""
    import torch

    weights, exp_avg, exp_avg_sq = start.clone(), torch.zeros_like(start), torch.zeros_like(start)
    step = torch.zeros(())  # AdamW's step count: a float32 tensor the kernel reads
    for _ in range(steps):
        step += 1
        torch._fused_adamw_([weights], [grad], [exp_avg], [exp_avg_sq], [], [step], **FUSED_ADAMW)
    return weights


def kernel_fingerprint() -> str:
    """sha256 (16 hex digits) of a few float32 ops whose results depend on the kernel paths: ATen's
    element-wise functions and reductions, fused AdamW, MKL's vector math (not its sqrt, which a portable
    run does not use) and matmuls of several shapes. Equal on two machines: those paths round alike
    there. Inputs are built from small integers, exactly, on any CPU."""
    import torch

    def values(*shape: int) -> torch.Tensor:
        n = 1
        for size in shape:
            n *= size
        return ((torch.arange(n, dtype=torch.int64) * 7919 % 263 - 131).to(torch.float32) / 64).reshape(shape)

    x = values(64, 320)
    weights = fused_adamw_steps(x, x.flip(0) / 8, steps=2)  # as a portable run's optimizer takes them
    results = [  # exp, log and tanh of float32 tensors run MKL's vector math (VM), the others ATen's kernels
        weights,
        x.exp().sum(dim=1),
        (x.abs() + 1).log(),
        x.tanh().sum(dim=0),
        torch.sigmoid(x).mean(),
        x.softmax(dim=-1).sum(dim=0),
        torch.rsqrt(x.pow(2).mean(dim=-1) + 1e-6),
        torch.nn.functional.gelu(x).sum(dim=1),
        x @ values(320, 96),
        values(8, 40) @ values(40, 8),
        x.t() @ x,
        values(1, 320) @ values(320, 1000),
    ]
    digest = hashlib.sha256()
    for result in results:
        digest.update(result.contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def main(argv: list[str]) -> int:
    if argv == ["--fingerprint"]:
        import torch

        torch.set_num_threads(2)  # workers.torch_threads' default: reductions split by the thread count
        print(
            f"{kernel_fingerprint()}  (torch {torch.__version__}, kernels {torch.backends.cpu.get_cpu_capability()}, "
            f"{torch.get_num_threads()} threads)"
        )
        return 0
    if len(argv) != 1 or argv[0] not in SETTINGS:
        print(
            f"usage: python -m roll_lite.runtime.reproducibility {{{','.join(SETTINGS)}}} | --fingerprint",
            file=sys.stderr,
        )
        return 2
    for name, value in kernel_env(argv[0]).items():
        print(f"export {name}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
