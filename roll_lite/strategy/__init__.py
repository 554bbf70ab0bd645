"""Training strategies. FSDP2Strategy is the only code that uses torch.distributed."""

from roll_lite.strategy.config import StrategyConfig

__all__ = ["StrategyConfig", "FSDP2Strategy"]


def __getattr__(name):
    # Lazy: importing the config must not pull in torch.distributed's FSDP machinery.
    if name == "FSDP2Strategy":
        from roll_lite.strategy.fsdp2 import FSDP2Strategy

        return FSDP2Strategy
    raise AttributeError(name)
