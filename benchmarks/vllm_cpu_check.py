"""Check roll_lite's vllm engine against the real vLLM 0.32.0 Python code, on a CPU machine.

vLLM's GPU kernels cannot run here, but its Python API and its own Qwen2 model class can:
- the sampling settings the engine sends build a vllm.SamplingParams with the same values;
- every keyword `start_llm` passes is a vLLM EngineArgs field; the outputs' fields the engine reads exist;
- the worker extension's method name does not clash with vLLM's GPU worker, which has `get_model`;
- the weights the engine sends (a HF state dict) load completely into vLLM's Qwen2ForCausalLM built on
  CPU, through its own `load_weights`, q/k/v and gate/up fused in order, tied and untied embeddings.

    python benchmarks/vllm_cpu_check.py

First run: makes .venv-vllm next to .venv (it reads this environment's torch and transformers), and
installs vllm 0.32.0 without its dependencies plus the pure-Python packages its import needs
(~350 MB download). Not a dependency of roll_lite, not part of the test suite.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".venv-vllm"
# vllm's own import chain (entrypoints, v1 worker, model code) on CPU; versions as checked on 2026-11-23
IMPORT_DEPS = ["apache-tvm-ffi==0.1.15.post2", "cachetools==8.0.1", "cbor2==6.3.0", "cloudpickle==3.1.2",
               "einops==0.8.2", "fastapi==0.165.0", "llguidance==1.9.1", "msgspec==0.22.0", "openai==3.54.0",
               "openai-harmony==0.0.8", "partial-json-parser==0.2.1.1.post7", "psutil==7.2.2", "py-cpuinfo==9.0.0",
               "pybase64==1.5.1", "pyzmq==27.3.0", "starlette==1.10.0", "uvloop==0.23.0", "xgrammar==0.2.8"]


def make_venv() -> Path:
    sys.path.insert(0, str(REPO / "benchmarks"))
    from shared_venv import venv_sharing_packages

    python = VENV / "bin" / "python"
    if not python.exists():
        venv_sharing_packages(VENV)
        from roll_lite.rollout.vllm_engine import VLLM_VERSION

        subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", f"vllm=={VLLM_VERSION}", *IMPORT_DEPS], check=True)
    return python


def check(name: str, ok: bool, detail: str = "") -> bool:
    print(f"| {name} | {'ok' if ok else 'FAILED'} | {detail} |")
    return ok


def run_checks() -> bool:
    import dataclasses
    import inspect

    import torch
    import vllm
    from vllm.engine.arg_utils import EngineArgs
    from vllm.outputs import CompletionOutput
    from vllm.v1.worker.gpu_worker import Worker

    from roll_lite.rollout import SamplingParams
    from roll_lite.rollout.vllm_engine import VLLM_VERSION, vllm_sampling_kwargs

    print(f"vllm {vllm.__version__} (roll_lite is written against {VLLM_VERSION}), torch {torch.__version__}\n")
    print("| check | result | detail |\n|---|---|---|")
    results = [check("vllm version", vllm.__version__ == VLLM_VERSION, vllm.__version__)]
    for label, params, seed in [("sampling", SamplingParams(16, 8, 0.7, 0.9, 20), 123),
                                ("sampling, defaults", SamplingParams(16, 8), 5),
                                ("greedy", SamplingParams(5, greedy=True), None)]:
        kwargs = vllm_sampling_kwargs(params, eos_token_id=2, request_seed=seed)
        built = vllm.SamplingParams(**kwargs)
        wrong = {k: (getattr(built, k), v) for k, v in kwargs.items() if getattr(built, k) != v}
        results.append(check(f"SamplingParams ({label})", not wrong, str(wrong or kwargs)))
    engine_keys = ["load_format", "skip_tokenizer_init", "generation_config", "dtype", "seed", "tensor_parallel_size",
                   "gpu_memory_utilization", "enable_sleep_mode", "logprobs_mode", "worker_extension_cls",
                   "distributed_executor_backend"]
    missing = [k for k in engine_keys if k not in {f.name for f in dataclasses.fields(EngineArgs)}]
    results.append(check("LLM keywords are EngineArgs fields", not missing, str(missing or "all")))
    fields = inspect.signature(CompletionOutput).parameters
    missing = [f for f in ("index", "token_ids", "finish_reason", "logprobs") if f not in fields]
    results.append(check("CompletionOutput fields read", not missing, str(missing or "all")))
    results.append(check("worker extension", hasattr(Worker, "get_model") and not hasattr(Worker, "roll_lite_load_weights"),
                         "get_model present, roll_lite_load_weights free"))
    for tied in (True, False):
        results.append(_check_weight_loading(tied))
    return all(results)


def _check_weight_loading(tied: bool) -> bool:
    """Our HF state dict into vLLM's own Qwen2ForCausalLM (built on CPU, world size 1, gloo)."""
    import torch
    from vllm.config import LoadConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.parallel_state import model_parallel_is_initialized
    from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM

    from roll_lite.modeling import build_causal_lm
    from roll_lite.rollout.vllm_engine import LoadWeightsInMemory, vllm_weights

    hf = build_causal_lm(dict(model_type="qwen2", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                              tie_word_embeddings=tied), seed=0)
    folder = tempfile.mkdtemp()
    hf.config.save_pretrained(folder)
    config = VllmConfig(model_config=ModelConfig(model=folder, skip_tokenizer_init=True, dtype="float32",
                                                 generation_config="vllm"),
                        load_config=LoadConfig(load_format="dummy"))
    with set_current_vllm_config(config):
        if not model_parallel_is_initialized():
            init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                         distributed_init_method=f"file://{tempfile.mktemp()}")
            initialize_model_parallel(1, 1)
        model = Qwen2ForCausalLM(vllm_config=config)
    worker = type("Worker", (LoadWeightsInMemory,), {"get_model": lambda self: model})()
    not_loaded = worker.roll_lite_load_weights(vllm_weights(hf.state_dict(), tie_word_embeddings=tied))
    ours, theirs = hf.state_dict(), dict(model.named_parameters())
    expected = {"model.embed_tokens.weight": ours["model.embed_tokens.weight"], "model.norm.weight": ours["model.norm.weight"]}
    for i in range(2):
        a, m = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        expected[f"{a}.qkv_proj.weight"] = torch.cat([ours[f"{a}.{n}_proj.weight"] for n in "qkv"])
        expected[f"{a}.qkv_proj.bias"] = torch.cat([ours[f"{a}.{n}_proj.bias"] for n in "qkv"])
        expected[f"{m}.gate_up_proj.weight"] = torch.cat([ours[f"{m}.gate_proj.weight"], ours[f"{m}.up_proj.weight"]])
        expected[f"{a}.o_proj.weight"] = ours[f"{a}.o_proj.weight"]
    if not tied:
        expected["lm_head.weight"] = ours["lm_head.weight"]
    different = [name for name, value in expected.items() if not torch.equal(theirs[name], value)]
    return check(f"weights load into vLLM's Qwen2 ({'tied' if tied else 'untied'} embeddings)",
                 not not_loaded and not different and ("lm_head.weight" in theirs) is (not tied),
                 f"not loaded {not_loaded}, differing {different}, {len(theirs)} parameters")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    if parser.parse_args().inside:
        return 0 if run_checks() else 1
    python = make_venv()
    # roll_lite from this checkout (the venv skips the editable install); vLLM's CPU platform
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_TARGET_DEVICE": "cpu"}
    return subprocess.run([python, __file__, "--inside"], env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
