"""`reproducible=portable` (roll_lite/runtime/reproducibility.py): the kernel variables, set in the driver, reach
every process of a run, and there the libraries compute with the pinned kernels.

The numbers are checked with kernel_fingerprint(): a few ATen and MKL ops whose results depend on the
kernel paths, compared with a fresh process started with the variables already in its environment.
On this project's AVX-512 box the machine's own kernels give another fingerprint, so a process the
variables did not reach fails the comparison. One test is a 1-step roll-train (~40 s); the rest take
seconds.

What no variable pins, MKL's vector math sqrt, a portable run does not use: AdamW runs fused and GRPO's
std goes through float64 (tests/test_reproducibility_unpinned.py). Where qemu-user is installed, the
fingerprint is compared with an emulated AVX2-only Intel CPU's.
"""

import functools
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from processes import wait_until_listening
from ray_hosts import HEAD_OPTIONS
from test_pipeline_ray import small

from roll_lite.config import ConfigError, load_config
from roll_lite.runtime.reproducibility import SETTINGS, check_kernels, fused_adamw_steps, kernel_env, main, pin_kernels

REPO = Path(__file__).resolve().parents[1]
PORTABLE = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "COMPATIBLE"}
RAY_AGENTS = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")
FINGERPRINT = (
    "import torch; torch.set_num_threads(1); "
    "from roll_lite.runtime.reproducibility import kernel_fingerprint; print(kernel_fingerprint())"
)
VM_SQRT = (
    "import hashlib, torch; x = torch.arange(1, 100001, dtype=torch.float32) / 7; "
    "print(hashlib.sha256(x.sqrt().numpy().tobytes()).hexdigest()[:16])"
)  # MKL's vector math sqrt
QEMU = shutil.which("qemu-x86_64-static")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any kernel variable, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in PORTABLE and k != "MKL_ENABLE_INSTRUCTIONS"}
    return {**env, "RAY_AUTH_MODE": "disabled", **extra}


def python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=clean_env(**env)
    )


def fingerprint(**env: str) -> str:
    result = python(FINGERPRINT, **env)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip()


@functools.cache
def machine() -> tuple[str, str, subprocess.CompletedProcess]:
    """The fingerprint and torch's kernels (`get_cpu_capability()`) of a process started without the
    variables, which then, torch having computed, tries to pin them (test_pinning_after_torch_computed_is_refused
    reads how it ended): one process for the three, once per module (each costs ~2 s of CPU to import torch)."""
    result = python(
        f"{FINGERPRINT}; print(torch.backends.cpu.get_cpu_capability(), flush=True); "
        "from roll_lite.runtime.reproducibility import pin_kernels; pin_kernels('portable')"
    )
    printed = result.stdout.split()
    assert len(printed) == 2, result.stdout[-2000:] + result.stderr[-2000:]
    return printed[0], printed[1], result


@functools.cache
def portable() -> tuple[str, str]:
    """The fingerprint and MKL's vector math sqrt (VM_SQRT) of a process started with the portable variables."""
    result = python(f"{FINGERPRINT}\n{VM_SQRT}", **PORTABLE)
    assert result.returncode == 0, result.stderr[-2000:]
    printed, vm_sqrt = result.stdout.split()
    return printed, vm_sqrt


@pytest.fixture(scope="module")
def fingerprints() -> dict[str, str]:
    """The machine's and the portable kernels' fingerprints, each from a process started with its variables."""
    return {"machine": machine()[0], "portable": portable()[0]}


def machine_kernels() -> str:
    return machine()[1]


# -- the mapping -----------------------------------------------------------------------------------


def test_each_setting_pins_these_variables():
    assert kernel_env("machine") == {}
    assert kernel_env("portable") == PORTABLE
    assert set(SETTINGS) == {"machine", "portable"}
    with pytest.raises(ValueError, match="reproducible: 'avx2' is not one of machine, portable"):
        kernel_env("avx2")


def test_the_config_key_takes_a_setting_and_names_itself_otherwise():
    assert load_config(None, []).reproducible == "machine"
    assert load_config(None, ["reproducible=portable"]).reproducible == "portable"
    with pytest.raises(ConfigError, match="reproducible: 'fast' is not one of machine, portable"):
        load_config(None, ["reproducible=fast"])


def test_the_module_prints_the_export_lines_for_processes_started_by_hand(capsys):
    assert main(["portable"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"export {k}={v}" for k, v in PORTABLE.items()]
    assert main(["fast"]) == 2


def test_the_fingerprints_adamw_steps_are_torch_optims_fused_adamw():
    # kernel_fingerprint() calls the fused kernel as AdamW(fused=True).step() does, without torch.optim
    import torch

    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    weights = torch.nn.Parameter(x.clone())
    weights.grad = x.flip(0) / 8
    adamw = torch.optim.AdamW([weights], lr=1e-2, fused=True)
    for _ in range(3):
        adamw.step()
    assert torch.equal(fused_adamw_steps(x, x.flip(0) / 8, steps=3), weights.detach())


# -- one process -------------------------------------------------------------------------------------


def test_a_variable_the_environment_sets_otherwise_is_an_error_naming_the_key(monkeypatch):
    monkeypatch.setattr(os, "environ", {**clean_env(), "MKL_CBWR": "AVX2"})
    with pytest.raises(
        ConfigError,
        match="reproducible: portable sets MKL_CBWR=COMPATIBLE, but the environment has "
        "MKL_CBWR=AVX2; unset it, or set reproducible=machine to keep it",
    ):
        pin_kernels("portable")


def test_a_worker_without_the_variables_refuses_to_compute(monkeypatch):
    monkeypatch.setattr(os, "environ", clean_env(MKL_CBWR="COMPATIBLE"))
    with pytest.raises(
        RuntimeError,
        match=r"reproducible=portable: process \d+ runs without "
        "ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2 in its environment",
    ):
        check_kernels("portable")
    check_kernels("machine")  # nothing to check


def test_pinning_in_the_running_driver_gives_the_kernels_of_a_process_started_with_the_variables(fingerprints):
    # roll-train sets the variables in its own process before torch computes: the same numbers as a
    # process whose environment had them from the start (ATen reads its variable at its first op, MKL
    # at its first call), the same set again by hand (any case) is fine.
    code = (
        "import os; os.environ['mkl_cbwr'.upper()] = 'compatible'; "
        "from roll_lite.runtime.reproducibility import pin_kernels; print(pin_kernels('portable')); " + FINGERPRINT
    )
    result = python(code)
    assert result.returncode == 0, result.stderr[-2000:]
    line, printed = result.stdout.strip().splitlines()
    assert line.startswith(
        "reproducible=portable: ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_CBWR=COMPATIBLE"
    )
    assert printed == fingerprints["portable"]


def test_pinning_after_torch_computed_is_refused():
    if machine_kernels() == "AVX2":
        pytest.skip("this CPU's own kernels are the pinned ones: nothing to tell apart")
    result = machine()[2]  # a process without the variables: the fingerprint computed, then pin_kernels
    assert result.returncode != 0
    assert "torch computes with its" in result.stderr and "not AVX2" in result.stderr, result.stderr[-2000:]


def test_the_pinned_kernels_give_other_numbers_than_this_machines_own(fingerprints):
    if machine_kernels() == "AVX2":
        pytest.skip("this CPU's own ATen kernels are the pinned ones")
    assert fingerprints["machine"] != fingerprints["portable"]
    assert fingerprint(**PORTABLE) == fingerprints["portable"]  # and they repeat


# -- every process of a run --------------------------------------------------------------------------

REPORTING = '''
import json
import os
from pathlib import Path

import torch

from roll_lite.runtime.reproducibility import KERNEL_VARIABLES, kernel_fingerprint

REPORTS = Path(__file__).parent / "reports"


def report(kind):
    """This process's kernels: torch's, the variables, and the fingerprint at one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    record = {"kind": kind, "pid": os.getpid(), "aten": torch.backends.cpu.get_cpu_capability(),
              "env": {name: os.environ.get(name) for name in KERNEL_VARIABLES}, "fingerprint": kernel_fingerprint()}
    torch.set_num_threads(threads)
    REPORTS.mkdir(exist_ok=True)
    (REPORTS / f"{kind}-{os.getpid()}.json").write_text(json.dumps(record))


def descendants(pid):
    children = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def environments(root):
    """The kernel variables each process under `root` was started with (/proc/PID/environ)."""
    found = {}
    for pid in descendants(root):
        try:
            pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\\0")
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\\0", b" ").decode(errors="replace")
        except OSError:
            continue
        env = dict(pair.decode(errors="replace").split("=", 1) for pair in pairs if b"=" in pair)
        found[pid] = {"command": command[:400], "env": {name: env.get(name) for name in KERNEL_VARIABLES}}
    return found


def reward(response, ground_truth, extra):
    """Runs in the guarded reward process while every worker of the run is alive."""
    if not (REPORTS / f"reward-{os.getpid()}.json").exists():
        report("reward")
        driver = json.loads(next(REPORTS.glob("driver-*.json")).read_text())["pid"]
        (REPORTS / "processes.json").write_text(json.dumps(environments(driver)))
    return float(response == ground_truth)
'''
# the pipeline in a module of its own: the reward's processes import usermod alone, not the pipelines (~1 s of CPU)
PIPELINE = '''
import os

from roll_lite.pipelines.ppo import PPOPipeline

from usermod import report


class Pipeline(PPOPipeline):
    """Built by the driver and by each model worker (after it set RANK)."""

    def __init__(self, config):
        super().__init__(config)
        report("worker" if "RANK" in os.environ else "driver")
'''


def test_a_portable_run_pins_the_kernels_of_the_driver_every_worker_and_the_reward_process(tmp_path, fingerprints):
    (tmp_path / "usermod.py").write_text(textwrap.dedent(REPORTING))
    (tmp_path / "userpipeline.py").write_text(textwrap.dedent(PIPELINE))
    command = [
        str(Path(sys.executable).parent / "roll-train"),
        "--config",
        str(REPO / "configs/grpo.yaml"),
        "pipeline=userpipeline:Pipeline",
        *small(tmp_path),
        "reward.functions={'usermod:reward': 1.0}",
        "rollout.in_actor=false",
        "workers.one_process_per_rank=false",  # every role a process of its own
        "steps=1",
        "eval_every=1",
        "save_model=false",
        "wandb_mode=disabled",
        f"output_dir={tmp_path / 'out'}",
        "run_name=portable",
        "reproducible=portable",
        "workers.backend=ray",  # every worker's process checked
    ]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=clean_env())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "reproducible=portable: ATEN_CPU_CAPABILITY=avx2" in result.stderr + result.stdout

    reports = [json.loads(path.read_text()) for path in (tmp_path / "reports").glob("*-*.json")]
    kinds = sorted(r["kind"] for r in reports)
    assert kinds == ["driver", "reward", "worker", "worker"], kinds  # the actor and the reference
    for record in reports:  # the variables, torch's kernels and the numbers, in each process
        assert {k: v for k, v in record["env"].items() if v is not None} == PORTABLE, record
        assert record["aten"] == "AVX2", record
        assert record["fingerprint"] == fingerprints["portable"], record

    # Every process under the driver (Ray's GCS and raylet, every worker it started, the reward
    # worker's guarded process) was started with the variables. Not looked at: Ray's own agents, which
    # run no torch and whose long process titles overwrite the memory /proc/PID/environ shows.
    processes = json.loads((tmp_path / "reports" / "processes.json").read_text())
    processes = {pid: p for pid, p in processes.items() if not p["command"].startswith(RAY_AGENTS)}
    roles = " ".join(p["command"] for p in processes.values())
    assert all(f"ray::{role}" in roles for role in ("ModelWorker", "RolloutWorker", "RewardWorker")), roles
    assert "roll_lite.rewards.guarded" in roles, roles
    unpinned = {pid: p for pid, p in processes.items() if {k: v for k, v in p["env"].items() if v} != PORTABLE}
    assert not unpinned, unpinned


def test_a_joined_clusters_workers_get_the_variables_from_the_jobs_runtime_env(monkeypatch, fingerprints):
    """A head started without the variables: its workers can only have them from start_ray's runtime_env."""
    import ray
    from roll_lite.workers.cluster import start_ray, stop_ray
    from roll_lite.workers.placement import Reservation

    from roll_lite.strategy.distributed import free_port

    for name in PORTABLE:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    ray_cli, port = str(Path(sys.executable).parent / "ray"), free_port()
    head = subprocess.Popen(
        [
            ray_cli,
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--include-dashboard=false",
            "--include-log-monitor=false",
            *HEAD_OPTIONS,  # what this head need not start (tests/ray_hosts.py)
            "--num-cpus=1",
            "--disable-usage-stats",
            "--node-ip-address=127.0.0.1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=clean_env(),
        start_new_session=True,
    )

    def kernels_here():
        import torch

        from roll_lite.runtime.reproducibility import KERNEL_VARIABLES, kernel_fingerprint

        torch.set_num_threads(1)
        return {
            "aten": torch.backends.cpu.get_cpu_capability(),
            "fingerprint": kernel_fingerprint(),
            "env": {name: os.environ.get(name) for name in KERNEL_VARIABLES if name in os.environ},
        }

    try:
        wait_until_listening(port, head, "the head")
        start_ray(f"127.0.0.1:{port}", Reservation(cpus=0, gpus=0, cpus_from="none"), env_vars=kernel_env("portable"))
        try:
            found = ray.get(ray.remote(num_cpus=0)(kernels_here).remote(), timeout=180)
        finally:
            stop_ray()
    finally:
        head.terminate()  # SIGTERM to `ray start --block` stops this head only
        head.wait(timeout=60)
    assert found == {"aten": "AVX2", "fingerprint": fingerprints["portable"], "env": PORTABLE}


# -- another CPU, emulated (and MKL's vector math sqrt, which no variable pins) ----------------------


@pytest.mark.skipif(QEMU is None, reason="qemu-x86_64-static is not installed: no other CPU to emulate")
def test_portable_gives_the_same_numbers_on_an_emulated_avx2_only_intel_cpu(fingerprints):
    """qemu-user runs this Python on an emulated Intel Haswell (AVX2, no AVX-512): ~15 s."""
    emulated = subprocess.run(
        [QEMU, "-cpu", "Haswell-v1", sys.executable, "-c", f"{FINGERPRINT}\n{VM_SQRT}"],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(**PORTABLE),
    )
    assert emulated.returncode == 0, emulated.stderr[-2000:]
    fingerprint_there, vm_sqrt_there = emulated.stdout.split()
    assert fingerprint_there == fingerprints["portable"]
    if machine_kernels() == "AVX512":
        # the emulated CPU is another one: MKL's vector math sqrt, which no variable pins, rounds otherwise there
        vm_sqrt_here = portable()[1]
        assert vm_sqrt_here != vm_sqrt_there
