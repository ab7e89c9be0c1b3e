"""Exact parameter counts of a causal LM by part, on the meta device (no memory, no download)."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..model.arch import heads_are_tied, locate, output_embeddings
from .presets import PRESETS, preset_config


def load_model_config(spec: str):
    """A transformers config from a preset name, a config.json file, or a model as `hydrappo train`
    takes it in model.name_or_path (a model directory, a .gguf file, a bundled name, a Hub id in
    the cache): storage/models.py resolves it, so the planner plans the model the run would load."""
    from transformers import AutoConfig

    if spec.lower() in PRESETS:
        return preset_config(spec)
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as error:  # (UnicodeDecodeError is one): its message names no file
            raise ValueError(f"{spec}: not a JSON config file ({error}); give a model's config.json.") from None
        if "model_type" not in data:
            raise ValueError(f"{spec}: config.json has no model_type.")
        model_type = data.pop("model_type")
        return AutoConfig.for_model(model_type, **data)
    return _training_model_config(spec)


def _training_model_config(spec: str):
    from ..storage.models import ModelLoadError, resolve_model_source, source_config

    try:
        return source_config(*resolve_model_source(spec, option="the model"))
    except ModelLoadError as error:
        raise ValueError(
            f"{spec!r} is neither a preset ({', '.join(sorted(PRESETS))}) nor a config.json file nor a model "
            f"`hydrappo train` can load: {error}"
        ) from None


def meta_model(config):
    """The causal LM of `config` on the meta device: shapes without memory."""
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(config)
    if getattr(config, "_attn_implementation_internal", None) is None:
        config._attn_implementation = "sdpa"
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def _numel(module: nn.Module | None) -> int:
    return sum(p.numel() for p in module.parameters()) if module is not None else 0


def _linear_shapes(module: nn.Module) -> list[tuple[int, int]]:
    """(in_features, out_features) of every linear map in `module` (nn.Linear and GPT-2's Conv1D):
    what LoRA with target_modules='all-linear' adapts."""
    shapes = []
    for sub in module.modules():
        if isinstance(sub, nn.Linear):
            shapes.append((sub.in_features, sub.out_features))
        elif type(sub).__name__ == "Conv1D" and hasattr(sub, "nf"):
            shapes.append((sub.weight.shape[0], sub.weight.shape[1]))
    return shapes


@dataclass
class ParameterCounts:
    """Exact parameter counts of a causal LM, by part."""

    total: int  # unique parameters (a tied lm_head is counted once)
    input_embeddings: int  # token (and position) embeddings, everything before the first layer
    layers: list[int]  # per decoder layer
    final_norm: int
    lm_head: int  # 0 when tied to the input embeddings
    lm_head_size: int  # the lm_head matrix, tied or not
    layer_linears: list[tuple[int, int]]  # linear maps of the top layer, for LoRA
    hidden_size: int
    vocab_size: int
    num_layers: int
    kv_size: int  # key (or value) features per token and layer: kv heads x head dim
    intermediate_size: int
    # What a quantized trunk (model/quantize.py) stores in 8 or 4 bits: the torch.nn.Linear maps of
    # each layer (weights, output rows, modules) and the input embeddings when they are an nn.Embedding.
    layer_linear_weights: list[int] = field(default_factory=list)
    layer_linear_rows: list[int] = field(default_factory=list)
    layer_linear_modules: list[int] = field(default_factory=list)
    largest_linear: int = 0  # weights of the largest linear map (dequantized per call)
    embedding_weights: int = 0
    embedding_rows: int = 0

    def top(self, n: int) -> int:
        return sum(self.layers[len(self.layers) - n :]) if n else 0


def count_parameters(config) -> ParameterCounts:
    """Count the parameters of `config`'s causal LM exactly, on the meta device."""
    model = meta_model(config)
    arch = locate(model)
    head = output_embeddings(model)
    tied = heads_are_tied(model)
    layers = [_numel(layer) for layer in arch.layers]
    final_norm = _numel(arch.final_norm)
    lm_head = 0 if tied else _numel(head)
    total = _numel(model)
    text = model.config.get_text_config()
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or arch.hidden_size // heads
    intermediate = getattr(text, "intermediate_size", None) or getattr(text, "n_inner", None) or 4 * arch.hidden_size
    linears = [[m for m in layer.modules() if type(m) is nn.Linear] for layer in arch.layers]
    embedding = model.get_input_embeddings()
    plain_embedding = type(embedding) is nn.Embedding
    return ParameterCounts(
        total=total,
        input_embeddings=total - sum(layers) - final_norm - lm_head,
        layers=layers,
        final_norm=final_norm,
        lm_head=lm_head,
        lm_head_size=head.weight.numel() + (head.bias.numel() if getattr(head, "bias", None) is not None else 0),
        layer_linears=_linear_shapes(arch.layers[-1]),
        hidden_size=arch.hidden_size,
        vocab_size=head.weight.shape[0],
        num_layers=len(layers),
        kv_size=kv_heads * head_dim,
        intermediate_size=intermediate,
        layer_linear_weights=[sum(m.weight.numel() for m in layer) for layer in linears],
        layer_linear_rows=[sum(m.out_features for m in layer) for layer in linears],
        layer_linear_modules=[len(layer) for layer in linears],
        largest_linear=max((m.weight.numel() for layer in linears for m in layer), default=0),
        embedding_weights=embedding.weight.numel() if plain_embedding else 0,
        embedding_rows=embedding.weight.shape[0] if plain_embedding else 0,
    )


def value_head_parameters(hidden: int) -> int:
    """hydrappo's ValueHead: Linear(h, 2h) + ReLU + Linear(2h, 1)."""
    return hidden * 2 * hidden + 2 * hidden + 2 * hidden + 1


def reward_head_parameters(hidden: int) -> int:
    return hidden + 1


def lora_parameters(linears: list[tuple[int, int]], rank: int) -> int:
    return sum(rank * (n_in + n_out) for n_in, n_out in linears)


def unique_bytes(tensors) -> int:
    """Bytes of the distinct tensors among `tensors` (a tied weight counts once)."""
    seen, total = set(), 0
    for tensor in tensors:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            total += tensor.numel() * tensor.element_size()
    return total
