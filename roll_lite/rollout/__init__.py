"""Rollout: generation engines (engine.py: the interface; choice.py: which engine a run gets; hf.py:
transformers `generate`; vllm_engine.py: vLLM, on GPU or CPU) and the queue of generations launched ahead of
training (ahead.py, rollout.async_steps)."""

from roll_lite.rollout.choice import choose_engine
from roll_lite.rollout.engine import Completions, RolloutEngine, SamplingParams
from roll_lite.rollout.hf import HFEngine, SampledLogProbs

__all__ = ["Completions", "HFEngine", "RolloutEngine", "SampledLogProbs", "SamplingParams", "choose_engine"]
