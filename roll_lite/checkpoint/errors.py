from roll_lite.config import ConfigError


class CheckpointError(ConfigError):
    """A bad `resume`, run directory or checkpoint: one line naming the key or file; roll-train exits 2."""
