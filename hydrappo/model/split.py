"""The split of the trunk: where the frozen bottom layers hand over to the top ones.

Every hydra pass goes through the model's own decoder. Two tools here act on its layer
list: `split_hook` hands over the hidden state at the split on every decoder pass (the
input of the first top layer; for N = 0 the output of the last layer), and `SkipLayer`
stands in for a bottom layer so that a branch pass starts from a cached split hidden
state. Position ids come from the attention mask, as transformers' `generate` computes
them, so a state recorded while sampling equals one of a whole-sequence pass.
"""

from __future__ import annotations

import torch
from torch import nn


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions count real tokens only, so a left-padded row is numbered as if unpadded."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last non-padding token of each row (works with left and right padding)."""
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    return (attention_mask.bool() * (positions + 1)).argmax(-1)


class StopTrunk(Exception):
    """Raised from a hook to end a decoder pass once the split hidden state is captured."""


def split_hook(layers: nn.ModuleList, split_index: int, receive):
    """Call `receive(hidden)` with the split hidden state (B, T, H), detached, on every pass
    of the decoder that owns `layers`: the input of layer `split_index`, or the output of
    the last layer when nothing is above the split. `receive` may raise StopTrunk to end
    the pass there. Returns the hook's handle (call .remove())."""
    if split_index < len(layers):

        def before_first_top_layer(module, args, kwargs):
            receive((args[0] if args else kwargs["hidden_states"]).detach())

        return layers[split_index].register_forward_pre_hook(before_first_top_layer, with_kwargs=True)

    def after_last_layer(module, args, output):
        receive((output[0] if isinstance(output, tuple) else output).detach())

    return layers[-1].register_forward_hook(after_last_layer)


class LayerStandIn(nn.Module):
    """Takes a decoder layer's place in the layer list for one pass. Attribute reads fall
    through to the real layer, because decoder loops read things such as
    `layer.attention_type` to pick each layer's mask."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        object.__setattr__(self, "_real_layer", layer)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(object.__getattribute__(self, "_real_layer"), name)


class SkipLayer(LayerStandIn):
    """Stands in for a bottom decoder layer during a branch pass: computes nothing.
    The last one returns the cached split hidden state instead of its input."""

    def __init__(self, layer: nn.Module, output: torch.Tensor | None, tuple_len: int):
        super().__init__(layer)
        object.__setattr__(self, "_output", output)
        self._tuple_len = tuple_len

    def forward(self, *args, **kwargs):
        hidden = self._output
        if hidden is None:
            hidden = args[0] if args else kwargs["hidden_states"]
        if self._tuple_len:
            return (hidden,) + (None,) * (self._tuple_len - 1)
        return hidden
