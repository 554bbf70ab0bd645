"""roll_lite: RL post-training for causal LMs whose step loss and gradient are exact.

Importing roll_lite never imports ray, vllm or flash_attn; those load only where they are used.
"""

__version__ = "0.2.0"
