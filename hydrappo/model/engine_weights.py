"""The policy's weights as a serving engine loads them (hydrappo/generation/serving.py).

An engine such as vLLM keeps its own copy of the model and loads weights by the names of the
transformers checkpoint (`model.layers.26.self_attn.q_proj.weight`, `lm_head.weight`), mapping
them onto its fused layers itself. `engine_weights(hydra)` lists every tensor of the policy's
model under those names, once, and says of each whether it can change in training:

- a parameter of the transformers model that trains (the top N layers; the final norm and the
  lm_head when they train) under its own name;
- with LoRA, an adapted linear map as ONE weight, the adapters merged into it (base + B A x
  scale, peft's own `get_delta_weight`), under the base layer's name: the engine has no
  adapters, and its layer is the policy's merged one. peft's `lora_A` / `lora_B` and the
  `base_layer` level of the names never appear;
- everything else (the frozen bottom, a frozen head) as frozen: the engine loads it once.

The reference copy of the top layers, the value head and the reward branch are not parts of the
transformers model (HydraModel holds them beside it), so they are never listed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class EngineWeight:
    """One tensor of the engine's model: its checkpoint name, whether training changes it, and
    how to read its current value (a view of the parameter, or a merged weight computed anew)."""

    name: str
    trains: bool
    read: Callable[[], torch.Tensor]


def _lora_layers(model: nn.Module) -> dict[str, nn.Module]:
    """{module path: peft LoRA layer} of the model (empty without peft adapters)."""
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # peft is a dependency; without it there can be no adapters either
        return {}
    return {path: module for path, module in model.named_modules() if isinstance(module, LoraLayer)}


@torch.no_grad()
def _merged(layer: nn.Module) -> torch.Tensor:
    """The base weight with the active adapters added, as peft's merge computes it; a layer
    peft has already merged holds that sum in its base weight."""
    weight = layer.get_base_layer().weight
    if getattr(layer, "merged", False):
        return weight.detach()
    merged = weight.detach().clone()
    for adapter in layer.active_adapters:
        if adapter in layer.lora_A:
            merged += layer.get_delta_weight(adapter).to(merged.dtype)
    return merged


def engine_weights(hydra) -> list[EngineWeight]:
    """Every tensor of `hydra.model` under its checkpoint name, LoRA layers merged (module doc)."""
    model = hydra.model
    lora = _lora_layers(model)
    weights = []
    # named_parameters lists a tied weight once (an lm_head tied to the embeddings is the
    # embeddings' parameter): the engine ties it the same way from the model's config.
    for name, param in model.named_parameters():
        owner = next((path for path in lora if name.startswith(path + ".")), None)
        if owner is None:
            weights.append(EngineWeight(name, param.requires_grad, param.detach))
            continue
        layer, rest = lora[owner], name[len(owner) + 1 :]
        if not rest.startswith("base_layer."):
            continue  # lora_A / lora_B: merged into the base weight below
        rest = rest.removeprefix("base_layer.")
        if rest == "weight":
            trains = any(p.requires_grad for p in layer.parameters())
            weights.append(EngineWeight(f"{owner}.weight", trains, lambda layer=layer: _merged(layer)))
        else:  # the base layer's bias: adapters leave it as it is
            weights.append(EngineWeight(f"{owner}.{rest}", param.requires_grad, param.detach))
    return weights
