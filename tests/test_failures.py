"""How roll-train fails: a worker that raises, dies or runs out of memory, and SIGINT / SIGTERM on the
driver. Each run is a real `roll-train` process (forked from the warm driver, tests/warm_driver.py) with
a tiny model and a pipeline (written to tmp_path) whose loss_func misbehaves on its second call, i.e. at
step 2. Each test checks the message, the exit code, and that none of the run's own processes (the
descendants of that roll-train: Ray's GCS, raylet, workers) outlive it; other Ray clusters on the machine
are not looked at.
"""

import fcntl
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

from processes import descendants
from test_pipeline_ray import REPO, small
from warm_driver import WarmPopen

PIPELINES = '''
import os
import time
from pathlib import Path

import torch

from roll_lite.pipelines.ppo import PPOPipeline

MARKS = Path(__file__).parent


class Misbehaving(PPOPipeline):
    """On its second call (step 2) the loss_func of the last actor rank writes its pid to <kind>.pid,
    then misbehaves; the other ranks go on into the gradient all-reduce and wait there."""

    kind = None

    def loss_func(self, batch, output):
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls == 2 and int(os.environ["RANK"]) == int(os.environ["WORLD_SIZE"]) - 1:
            (MARKS / f"{self.kind}.pid").write_text(str(os.getpid()))
            self.misbehave()
        return super().loss_func(batch, output)


class Raises(Misbehaving):
    kind = "raises"

    def misbehave(self):
        raise ValueError("this loss_func fails on purpose")


class OutOfMemory(Misbehaving):
    kind = "oom"

    def misbehave(self):  # a real allocation that fails: 100 TB
        torch.empty(10**14, dtype=torch.uint8)


class NaNFromStep2(PPOPipeline):
    """From its second call (step 2) on, a nan loss: every optimizer step is skipped."""

    def loss_func(self, batch, output):
        self.calls = getattr(self, "calls", 0) + 1
        loss, metrics = super().loss_func(batch, output)
        return (loss * float("nan") if self.calls >= 2 else loss), metrics


class CriticRaises(PPOPipeline):
    """The critic (in the actor's process: workers.one_process_per_rank) raises at step 2."""

    def critic_loss_func(self, batch, output):
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls == 2:
            (MARKS / "critic.pid").write_text(str(os.getpid()))
            raise ValueError("this critic_loss_func fails on purpose")
        return super().critic_loss_func(batch, output)


class Pauses(Misbehaving):
    kind = "pauses"  # the test kills the rollout worker meanwhile

    def misbehave(self):
        time.sleep(3)


class Hangs(Misbehaving):
    kind = "hangs"  # the test kills the worker or signals the driver meanwhile

    def misbehave(self):
        time.sleep(120)
'''


def start(tmp_path, pipeline: str, *overrides: str, terminal: bool = False) -> subprocess.Popen:
    """roll-train with a pipeline of PIPELINES, in a session of its own (its own process group); its
    output goes to a pipe, or with `terminal` to a pseudo-terminal (read into process.output)."""
    (tmp_path / "failing_pipelines.py").write_text(PIPELINES)
    command = [
        sys.executable,
        "-m",
        "roll_lite.cli",
        "--config",
        str(REPO / "configs/grpo.yaml"),
        *small(tmp_path),
        f"pipeline=failing_pipelines:{pipeline}",
        "steps=50",
        "eval_every=100",
        "data.eval_files=[]",  # no held-out evaluation, at step 0 either: these runs stop in step 2 or 3
        "save_model=false",
        "algorithm.track_kl=false",  # no reference worker: one process less to start
        "algorithm.check_loss=false",  # these loss_funcs misbehave on purpose, in the workers
        f"output_dir={tmp_path}",
        "run_name=run",
        "workers.backend=ray",  # these test Ray workers' failures (an override may still ask for local)
        *overrides,
    ]
    options = dict(cwd=tmp_path, start_new_session=True)
    if not terminal:
        return WarmPopen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **options)
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a new pty is 0 columns wide
    process = WarmPopen(command, stdout=child, stderr=child, **options)
    os.close(child)
    process.output = []
    threading.Thread(target=_read_terminal, args=(main, process.output), daemon=True).start()
    return process


def _read_terminal(fd: int, chunks: list[str]) -> None:
    while True:
        try:
            data = os.read(fd, 4096)
        except OSError:  # EIO: every process holding the terminal has exited
            data = b""
        if not data:
            os.close(fd)
            return
        chunks.append(data.decode(errors="replace"))


def _output(process: subprocess.Popen) -> str:
    return "".join(process.output) if hasattr(process, "output") else ""


def wait_for_file(path: Path, process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, (process.stdout.read() if process.stdout else _output(process))[-3000:]
        assert time.monotonic() < deadline, f"{path.name} did not appear"
        time.sleep(0.1)
    time.sleep(0.2)  # the pid is written before the file is closed


def alive(pids: set[int]) -> set[int]:
    """The pids that still run (zombies excluded)."""
    running = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            running.add(pid)
    return running


def finish(process: subprocess.Popen, run_pids: set[int], timeout: float = 60) -> tuple[int, str, float]:
    """(exit code, output, seconds until it exited); checks that the run's processes are gone."""
    start = time.monotonic()
    output, _ = process.communicate(timeout=timeout)
    exited = time.monotonic() - start
    if output is None:  # on a terminal
        deadline = time.monotonic() + 5
        while "roll-train:" not in _output(process) and time.monotonic() < deadline:
            time.sleep(0.1)
        output = _output(process)
    deadline = time.monotonic() + 10  # the raylet and GCS notice that their driver is gone
    while alive(run_pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = {pid: Path(f"/proc/{pid}/cmdline").read_bytes()[:80] for pid in alive(run_pids)}
    assert not left, f"processes of the run left behind: {left}"
    return process.returncode, output, exited


def test_a_worker_that_raises_stops_the_run_with_its_role_rank_step_and_traceback(tmp_path):
    process = start(tmp_path, "Raises")
    wait_for_file(tmp_path / "raises.pid", process)
    code, output, _ = finish(process, descendants(process.pid))
    assert code == 1, output[-3000:]
    assert "roll-train: worker failure: actor rank 0 raised an error in train_step at step 2" in output, output[-3000:]
    assert "ValueError: this loss_func fails on purpose" in output  # the worker's traceback
    assert "failing_pipelines.py" in output and "in misbehave" in output
    assert "Traceback" not in output.split("roll-train: worker failure")[0][-2000:]  # no driver stack dump before it


def test_a_role_that_raises_in_the_actors_process_is_named_as_itself(tmp_path):
    process = start(tmp_path, "CriticRaises", "algorithm.advantage=gae")
    wait_for_file(tmp_path / "critic.pid", process)
    code, output, _ = finish(process, descendants(process.pid))
    assert code == 1, output[-3000:]
    assert "critic: in the actor's processes" in output, output[-3000:]
    assert "roll-train: worker failure: critic rank 0 raised an error in train_step at step 2" in output, output[-3000:]
    assert "ValueError: this critic_loss_func fails on purpose" in output


def test_a_worker_out_of_memory_names_the_config_keys_to_lower(tmp_path):
    # A real failed allocation (100 TB) in the worker; torch's CPU allocator raises a plain RuntimeError.
    # CUDA's torch.OutOfMemoryError and Ray's memory monitor kills are classified in tests/test_worker_errors.py
    # (no GPU here, and filling the 24 GiB until the monitor kills a worker would take the machine down).
    process = start(tmp_path, "OutOfMemory")
    wait_for_file(tmp_path / "oom.pid", process)
    code, output, _ = finish(process, descendants(process.pid))
    assert code == 1, output[-3000:]
    assert "actor rank 0 ran out of memory in train_step at step 2: lower rollout.prompts_per_step, " in output, output[
        -3000:
    ]
    for key in (
        "rollout.num_samples",
        "rollout.max_new_tokens",
        "actor.grad_accum_steps",
        "actor.max_tokens_per_micro_batch",
        "model.gradient_checkpointing=true",
    ):
        assert key in output, key
    assert "DefaultCPUAllocator: can't allocate memory: you tried to allocate 100000000000000 bytes" in output


def test_a_run_stopped_by_nan_steps_says_why_in_one_line_with_the_drivers_step(tmp_path):
    # the pipeline's own stop, not Ray's: in one process (workers.backend=local, the same message as on Ray)
    process = start(tmp_path, "NaNFromStep2", "actor.max_consecutive_skipped_steps=2", "workers.backend=local")
    code, output, _ = finish(process, descendants(process.pid), timeout=300)
    assert code == 1, output[-3000:]
    assert "step 2/50 | reward" in output and "step 3/50" not in output  # steps 2 and 3 skipped: it stops in step 3
    assert output.strip().splitlines()[-1] == (
        "roll-train: actor rank 0 stopped the run in train_step at step 3: grad norm is nan, optimizer step skipped "
        "(2 in a row); rank 0: no nan/inf in this rank's batch tensors: the model's forward or the loss_func produced "
        "it; actor.max_consecutive_skipped_steps=2 reached (raise it, or null to never stop; lowering lr or fixing "
        "the data usually helps)"
    ), output[-3000:]
    assert "Traceback" not in output and "optimizer step 1:" not in output  # no worker stack, no count of its own


def test_a_killed_worker_is_reported_within_seconds(tmp_path):
    # Two actor ranks: rank 0 waits in the gradient all-reduce for rank 1, which is killed.
    process = start(tmp_path, "Hangs", "workers.actor_dp=2", "workers.actor_cpus=0.5", "workers.rollout_cpus=0.5")
    wait_for_file(tmp_path / "hangs.pid", process)
    run_pids = descendants(process.pid)
    worker = int((tmp_path / "hangs.pid").read_text())
    assert worker in run_pids
    os.kill(worker, signal.SIGKILL)
    code, output, seconds = finish(process, run_pids, timeout=60)
    assert code == 1, output[-3000:]
    assert "roll-train: worker failure: actor rank 1 died during train_step at step 2" in output, output[-3000:]
    assert f"pid: {worker}" in output  # Ray's account of the death follows
    assert seconds < 30, seconds  # detection + shutdown; Ray reports the death at once (TIMEOUT_S is 30 min)


def test_sigterm_to_the_driver_abandons_the_step_and_stops_the_workers_with_plain_log_lines(tmp_path):
    # `kill PID`: the driver alone gets SIGTERM. Its output is a pipe: log lines, no progress bar.
    process = start(tmp_path, "Hangs")
    wait_for_file(tmp_path / "hangs.pid", process)
    run_pids = descendants(process.pid)
    process.send_signal(signal.SIGTERM)
    returncode, output, seconds = finish(process, run_pids, timeout=60)
    assert returncode == 143, output[-3000:]
    assert "interrupted during step 2; stopping the workers" in output
    # Step 1 was the last completed one; checkpoint.every=50: nothing was due.
    assert "no checkpoint written on stop: the last completed step, 1, was not due (checkpoint.every=50)" in output
    assert (
        "roll-train: stopped by SIGTERM during step 2, which was abandoned; the workers and Ray were stopped" in output
    )
    assert "Aborted" not in output and "SIGTERM received" not in output  # Ray's own handler: a stack dump, exit 134
    assert seconds < 30, seconds
    assert "step 1/50 | reward" in output and "\r" not in output and "RL:" not in output


def test_ctrl_c_in_a_terminal_stops_the_run_and_the_progress_bar_was_shown(tmp_path):
    # Ctrl-C in a terminal sends SIGINT to the whole foreground process group: the driver and the
    # Ray processes it started. The output is a terminal: a progress bar, the step lines above it.
    process = start(tmp_path, "Hangs", terminal=True)
    wait_for_file(tmp_path / "hangs.pid", process)
    run_pids = descendants(process.pid)
    os.killpg(process.pid, signal.SIGINT)
    returncode, output, seconds = finish(process, run_pids, timeout=60)
    assert returncode == 130, output[-3000:]
    assert (
        "roll-train: stopped by SIGINT during step 2, which was abandoned; the workers and Ray were stopped" in output
    )
    assert seconds < 30, seconds
    assert "RL:" in output and "1/50" in output  # tqdm's bar after step 1
    assert "step 1/50 | reward" in output  # the log line, written above the bar
    assert "\rroll-train: stopped by SIGINT" in output  # the bar was erased before the last message


def test_kill_9_of_the_driver_alone_takes_all_the_clusters_processes_with_it(tmp_path):
    # The GCS and the raylet die with the driver (Ray's PDEATHSIG), the workers within ~2 s; the
    # raylet's runtime-env agent lived on ~60 s (a report to the dead GCS) before workers/leftovers.py's
    # watcher killed it with the driver.
    process = start(tmp_path, "Hangs")
    wait_for_file(tmp_path / "hangs.pid", process)
    run_pids = descendants(process.pid)
    names = {pid: Path(f"/proc/{pid}/cmdline").read_bytes()[:60] for pid in run_pids}
    assert any(b"ray::RuntimeEnvAgent" in name for name in names.values()), names
    process.kill()
    process.communicate()
    killed = time.monotonic()
    while alive(run_pids) and time.monotonic() - killed < 5:
        time.sleep(0.1)
    assert not alive(run_pids), {pid: names[pid] for pid in alive(run_pids)}


def test_a_worker_that_is_alive_but_stuck_is_warned_about_then_stops_the_run_after_call_timeout_s(tmp_path):
    # Two actor ranks: rank 1 sleeps inside its loss_func (alive, stuck); rank 0 waits for it in the
    # gradient all-reduce. Neither answers; the warnings and the final error name both.
    process = start(
        tmp_path,
        "Hangs",
        "workers.actor_dp=2",
        "workers.actor_cpus=0.5",
        "workers.rollout_cpus=0.5",
        "workers.call_timeout_s=8",
        "workers.stall_warning_s=3",
    )
    wait_for_file(tmp_path / "hangs.pid", process)
    run_pids = descendants(process.pid)
    code, output, seconds = finish(process, run_pids, timeout=60)
    assert code == 1, output[-3000:]
    assert (
        "still waiting for actor ranks 0, 1 to answer train_step after 3 s; the run stops after 8 s "
        "(workers.call_timeout_s)"
    ) in output, output[-3000:]
    assert "roll-train: worker failure: actor rank 0 did not answer train_step at step 2" in output, output[-3000:]
    assert "no answer from actor ranks 0, 1 within 8 s (workers.call_timeout_s): alive but stuck" in output
    assert seconds < 40, seconds  # the sleeping worker would take 120 s


def test_fully_async_a_rollout_worker_killed_while_a_step_trains_stops_the_run_naming_it(tmp_path):
    """rollout.fully_async: the next batch is in flight on the rollout worker while step 2 trains; the
    worker is killed then. The driver's next wait on it (the weight update, or the batch) names it."""
    process = start(tmp_path, "Pauses", "rollout.fully_async=true", "algorithm.rollout_is=token")
    wait_for_file(tmp_path / "pauses.pid", process)
    run_pids = descendants(process.pid)
    rollout = [pid for pid in run_pids if b"RolloutWorker" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(rollout) == 1, {pid: Path(f"/proc/{pid}/cmdline").read_bytes()[:80] for pid in run_pids}
    os.kill(rollout[0], signal.SIGKILL)
    code, output, seconds = finish(process, run_pids, timeout=60)
    assert code == 1, output[-3000:]
    failure = re.search(r"roll-train: worker failure: rollout died during (\w+) at step (\d+)", output)
    assert failure and failure[1] in ("update_weights", "finish") and failure[2] in ("2", "3"), output[-3000:]
    assert seconds < 30, seconds
