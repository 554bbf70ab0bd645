"""Errors a user acts on, shared by modules that must not import each other (config, reproducibility)."""


class ConfigError(ValueError):
    """A bad config key or value: the message is one line naming the key and what is allowed."""
