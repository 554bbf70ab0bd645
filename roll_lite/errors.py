"""Errors a user acts on, shared by modules that must not import each other (config, reproducibility)."""


class ConfigError(ValueError):
    """A bad config key or value: the message is one line naming the key and what is allowed."""


class StaleRolloutWeights(RuntimeError):
    """The rollout engine's log-probs are far from the actor's on a batch sampled after the latest
    weight sync: the engine is not on the actor's weights (rollout.max_logp_gap)."""
