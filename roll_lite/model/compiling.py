"""torch.compile of the decoder layers (`model.compile_layers`).

Each decoder layer's `forward` is compiled, not the module: FSDP2's hooks (registered on the
module) and HF's activation checkpointing (its `__call__`) stay outside the compiled code, and the
parameter names do not change (no `_orig_mod.` in checkpoints or weight syncs). All layers share one
compiled graph (they run the same code on tensors of the same shapes). Packed attention runs eagerly
between the two compiled parts of a layer (roll_lite/model/attention.py).

Shapes are dynamic from the start (`dynamic=True`): a micro-batch's token count changes every step,
and a static compile would compile again for the second length seen. A compile still happens for
each new kind of input: packed (no attention mask) and padded micro-batches; measured in
tests/test_compile_layers.py and benchmarks/mfu.py.

Float64 models differ from eager by float32 roundings: HF's RMSNorm computes in float32 whatever the
model's dtype, and inductor rounds that float32 arithmetic otherwise than eager does (~1e-7 relative).
"""

from __future__ import annotations

import torch
from torch import nn


def compile_decoder_layers(lm: nn.Module, backend: str = "inductor") -> nn.Module:
    """Compile the `forward` of every decoder layer of a HF causal LM in place; returns `lm`."""
    layers = getattr(lm.get_decoder(), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"model.compile_layers: {type(lm).__name__} has no decoder layers (get_decoder().layers)")
    for layer in layers:
        layer.forward = torch.compile(layer.forward, dynamic=True, backend=backend)
    return lm
