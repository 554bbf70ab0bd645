"""Rollout: generation engines (engine.py: the interface and the choice; hf.py: transformers
`generate`) and the queue of generations launched ahead of training (ahead.py, rollout.async_steps)."""

from roll_lite.rollout.engine import Completions, RolloutEngine, SamplingParams, choose_engine
from roll_lite.rollout.hf import HFEngine, SampledLogProbs

__all__ = ["Completions", "HFEngine", "RolloutEngine", "SampledLogProbs", "SamplingParams", "choose_engine"]
