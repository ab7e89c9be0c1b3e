"""Locate the parts of a Hugging Face causal LM that hydrappo needs.

hydrappo has no per-architecture forward code. It runs the model's own decoder
forward (masks, rotary embeddings, per-layer attention types, final norm) and only
needs to know *where* a few modules live: the decoder module that owns the layer
list, the layer list itself, the final norm, and the output embeddings. Those are
found with a short table of attribute paths; a user with an exotic model passes
`layers_path=` instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..errors import UsageError

# Paths relative to the decoder module (the one whose forward loops over the layers).
LAYER_LIST_PATHS = ("layers", "h", "blocks", "decoder.layers", "transformer.h", "transformer.layers")
FINAL_NORM_PATHS = ("norm", "ln_f", "final_layer_norm", "final_layernorm", "decoder.final_layer_norm", "norm_f")


class UnsupportedModelError(UsageError):
    """The model's structure or settings cannot be wrapped by hydrappo."""


def get_path(root: nn.Module, path: str):
    obj = root
    for name in path.split("."):
        obj = getattr(obj, name)
    return obj


def set_path(root: nn.Module, path: str, value) -> None:
    parent_path, _, name = path.rpartition(".")
    parent = get_path(root, parent_path) if parent_path else root
    setattr(parent, name, value)


def has_path(root: nn.Module, path: str) -> bool:
    try:
        get_path(root, path)
    except AttributeError:
        return False
    return True


@dataclass
class Architecture:
    """Where things live inside one causal LM.

    `decoder` is the module whose forward embeds the tokens, loops over the layers
    and applies the final norm (LlamaModel, GPT2Model, OPTDecoder, ...).
    `layers_path` and `norm_path` are relative to `decoder`.
    """

    decoder: nn.Module
    layers_path: str
    norm_path: str | None
    hidden_size: int

    @property
    def layers(self) -> nn.ModuleList:
        return get_path(self.decoder, self.layers_path)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def final_norm(self) -> nn.Module | None:
        return get_path(self.decoder, self.norm_path) if self.norm_path else None


def _find_decoder(model: nn.Module, layers_path: str | None) -> tuple[nn.Module, str]:
    """The innermost module that holds the layer list, and the list's path in it."""
    candidates = []
    for candidate in (
        model.get_decoder() if hasattr(model, "get_decoder") else None,
        getattr(model, "base_model", None),
        model,
    ):
        if isinstance(candidate, nn.Module) and all(candidate is not c for c in candidates):
            candidates.append(candidate)

    if layers_path is not None:
        # A user-given path is relative to the whole model; split it at the list.
        if not has_path(model, layers_path) or not isinstance(get_path(model, layers_path), nn.ModuleList):
            raise UnsupportedModelError(
                f"layers_path={layers_path!r} does not name an nn.ModuleList inside {type(model).__name__}."
            )
        parent_path, _, name = layers_path.rpartition(".")
        return (get_path(model, parent_path) if parent_path else model), name

    for decoder in candidates:
        for path in LAYER_LIST_PATHS:
            if has_path(decoder, path) and isinstance(get_path(decoder, path), nn.ModuleList):
                return decoder, path
    raise UnsupportedModelError(
        f"hydrappo cannot find the decoder layer list of {type(model).__name__} (looked for "
        f"{', '.join(LAYER_LIST_PATHS)} under {type(candidates[0]).__name__}). Pass the dotted path of the "
        "nn.ModuleList of decoder layers, e.g. HydraModel(model, layers_path='model.layers')."
    )


def _hidden_size(model: nn.Module, layers: nn.ModuleList) -> int:
    config = getattr(model, "config", None)
    config = getattr(config, "get_text_config", lambda: config)() if config is not None else None
    for name in ("hidden_size", "n_embd", "d_model", "word_embed_proj_dim"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    raise UnsupportedModelError(f"cannot read the hidden size of {type(model).__name__} from its config.")


def locate(model: nn.Module, layers_path: str | None = None) -> Architecture:
    """Find decoder, layer list and final norm of `model` (a causal LM)."""
    decoder, path = _find_decoder(model, layers_path)
    norm_path = next((p for p in FINAL_NORM_PATHS if has_path(decoder, p)), None)
    if norm_path is not None and not isinstance(get_path(decoder, norm_path), nn.Module):
        norm_path = None
    layers = get_path(decoder, path)
    if len(layers) == 0:
        raise UnsupportedModelError(f"{type(model).__name__} has an empty decoder layer list.")
    return Architecture(decoder=decoder, layers_path=path, norm_path=norm_path, hidden_size=_hidden_size(model, layers))


def output_embeddings(model: nn.Module) -> nn.Module:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        raise UnsupportedModelError(
            f"{type(model).__name__} has no output embeddings (lm_head): hydrappo needs a causal LM "
            "(AutoModelForCausalLM), not a base model or a classifier."
        )
    return head


def heads_are_tied(model: nn.Module) -> bool:
    head = output_embeddings(model)
    inputs = model.get_input_embeddings()
    if head.weight is inputs.weight:
        return True
    # Two Parameter objects over one storage are tied too; on the meta device every data
    # pointer is 0, so there only identity can tell.
    return head.weight.device.type != "meta" and head.weight.data_ptr() == inputs.weight.data_ptr()


def raw_logits(logits: torch.Tensor) -> torch.Tensor:
    """The logits of a model that does nothing to `lm_head(hidden)` (logits_transform returns
    this very function then, so that model/logprobs.py can skip differentiating through it)."""
    return logits


def logits_transform(model: nn.Module):
    """What the model's own forward does to `lm_head(hidden)` before returning logits.

    Returns an elementwise function of the raw logits (`raw_logits` when there is none). The table covers the post-processing found
    in transformers' causal LMs; `HydraModel` checks the result against the model's own
    logits at construction, so a model that does something else fails loudly.
    """
    config = getattr(model, "config", None)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    softcap = getattr(config, "final_logit_softcapping", None)
    scale = getattr(model, "logit_scale", None)
    divide = getattr(config, "logits_scaling", None)
    steps = []
    if isinstance(scale, (int, float)) and scale != 1:
        steps.append(lambda x: x * scale)
    if isinstance(divide, (int, float)) and divide != 1:
        steps.append(lambda x: x / divide)
    if softcap:
        steps.append(lambda x: torch.tanh(x / softcap) * softcap)
    if not steps:
        return raw_logits

    def transform(logits: torch.Tensor) -> torch.Tensor:
        for step in steps:
            logits = step(logits)
        return logits

    return transform


def cache_argument(model: nn.Module, cache) -> dict:
    """The keyword that hands a KV cache to `model`'s forward and `generate`: transformers 5
    renamed `past_key_values` to `cache` (the old name warns, and goes in 6); older 5.x
    models only know the old one. Empty when there is no cache to hand over."""
    if cache is None:
        return {}
    import inspect

    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    return {name: cache}


def output_cache(output):
    """The KV cache a forward or `generate` returned: `output.cache` since transformers 5
    renamed it (reading `past_key_values` warns), `past_key_values` on older 5.x."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values
