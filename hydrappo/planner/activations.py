"""Bytes autograd keeps during hydrappo's update, traced from one decoder layer on the meta device."""

from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from ..model.arch import locate
from ..model.heads import ValueHead
from ..model.split import LayerStandIn, position_ids_from_mask
from .counts import meta_model


class _FusedAttention(torch.autograd.Function):
    """Stands in for scaled_dot_product_attention while tracing: keeps what a fused kernel
    (flash / memory-efficient) keeps for backward: q, k, v, the output, the log-sum-exp and
    an additive mask in the compute dtype."""

    @staticmethod
    def forward(ctx, query, key, value, mask):
        out = query.new_empty(query.shape[:-1] + (value.shape[-1],))
        lse = query.new_empty(query.shape[:-1], dtype=torch.float32)
        saved = [query, key, value, out, lse]
        if mask is not None:
            saved.append(mask.new_empty(mask.shape, dtype=query.dtype) if mask.dtype == torch.bool else mask)
        ctx.save_for_backward(*saved)
        return out

    @staticmethod
    def backward(ctx, grad):  # pragma: no cover - tracing never runs backward
        raise NotImplementedError


@contextmanager
def _fused_sdpa():
    original = torch.nn.functional.scaled_dot_product_attention

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        return _FusedAttention.apply(query, key, value, attn_mask)

    torch.nn.functional.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = original


class _Captured(Exception):
    pass


class _CaptureLayer(LayerStandIn):
    """Replaces a decoder layer to record its call arguments."""

    def __init__(self, layer):
        super().__init__(layer)
        object.__setattr__(self, "call", None)

    def forward(self, *args, **kwargs):
        object.__setattr__(self, "call", (args, kwargs))
        raise _Captured


def _to_meta(value):
    if isinstance(value, torch.Tensor):
        return value.to("meta")
    if isinstance(value, (tuple, list)):
        return type(value)(_to_meta(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_meta(v) for k, v in value.items()}
    return value


class _SavedBytes:
    """Bytes of the distinct tensors autograd keeps for backward (parameters excluded)."""

    def __init__(self, exclude: list[nn.Parameter]):
        self.exclude = {p.untyped_storage()._cdata for p in exclude}
        self.storages: dict[int, int] = {}

    def pack(self, tensor):
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key not in self.exclude:
            self.storages[key] = max(self.storages.get(key, 0), storage.nbytes())
        return tensor

    def add(self, tensor: torch.Tensor) -> None:
        self.pack(tensor)

    @property
    def total(self) -> int:
        return sum(self.storages.values())

    @contextmanager
    def recording(self):
        with torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t):
            yield


@dataclass
class ActivationTrace:
    layer: int  # bytes kept for backward by one trainable top layer
    layer_input: int  # the hidden state entering a layer (what activation checkpointing keeps)
    tail: int  # final norm + value head + the hidden states the checkpointed log-prob chunks keep


def trace_activations(
    config, batch: int, seq_len: int, dtype: torch.dtype, lora_rank: int = 0, train_final_norm: bool = False
) -> ActivationTrace:
    """Bytes autograd keeps during hydrappo's update for one micro-batch of `batch` x `seq_len`.

    The top layer's call arguments (masks, rotary embeddings, ...) come from the model's own
    decoder forward on a one-layer copy of the config with a 16-token vocabulary, run on the
    CPU (nothing but the embeddings is materialised); the layer itself then runs on the meta
    device with the saved-tensor hooks counting."""
    small = copy.deepcopy(config)
    text = small.get_text_config()
    layer_types = getattr(text, "layer_types", None)
    text.num_hidden_layers = 1
    if isinstance(layer_types, (list, tuple)) and layer_types:
        text.layer_types = [layer_types[-1]]
    text.vocab_size = 16
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if getattr(text, name, None) is not None:
            setattr(text, name, 0)
    model = meta_model(small).to(dtype)
    arch = locate(model)
    real_layer = arch.layers[0]
    capture = _CaptureLayer(real_layer)
    arch.layers[0] = capture
    norm = copy.deepcopy(arch.final_norm)  # stays on the meta device
    model.to_empty(device="cpu")
    ids = torch.zeros(batch, seq_len, dtype=torch.long)
    mask = torch.ones(batch, seq_len, dtype=torch.long)
    if seq_len > 1:
        mask[0, 0] = 0  # left padding, as in every PPO batch: the mask is materialised
    try:
        with torch.no_grad():
            arch.decoder(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask), use_cache=False)
    except _Captured:
        pass
    if capture.call is None:
        raise RuntimeError(f"could not capture the decoder layer's arguments of {type(model).__name__}.")
    args, kwargs = _to_meta(capture.call)
    kwargs = dict(kwargs)
    hidden = (args[0] if args else kwargs.pop("hidden_states")).detach()
    args = args[1:]

    if lora_rank:
        _add_lora(real_layer, lora_rank)
    else:
        real_layer.requires_grad_(True)
    layer_trace = _SavedBytes(list(real_layer.parameters()))
    with torch.enable_grad(), layer_trace.recording(), _fused_sdpa():
        real_layer(hidden.requires_grad_(True), *args, **kwargs)

    # Tail: final norm, value head, and the final hidden state the checkpointed chunks keep.
    value_head = ValueHead(arch.hidden_size).to("meta")
    params = list(value_head.parameters()) + (list(norm.parameters()) if norm is not None else [])
    tail = _SavedBytes(params)
    with torch.enable_grad(), tail.recording():
        x = torch.empty(hidden.shape, dtype=dtype, device="meta", requires_grad=True)
        if norm is not None:
            norm.requires_grad_(train_final_norm)
            x = norm(x)
        value_head(x)
        tail.add(x)
    return ActivationTrace(
        layer=layer_trace.total,
        layer_input=hidden.numel() * hidden.element_size(),
        tail=tail.total,
    )


def _add_lora(layer: nn.Module, rank: int) -> None:
    """LoRA on every linear map of `layer` with peft (adapters in float32, as peft keeps them)."""
    from peft import LoraConfig, inject_adapter_in_model

    names = sorted({name.rsplit(".", 1)[-1] for name, sub in layer.named_modules() if isinstance(sub, nn.Linear)})
    layer.requires_grad_(False)
    inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=rank, lora_dropout=0.0, target_modules=names), layer)
    for name, param in layer.named_parameters():
        if "lora_" in name:
            param.data = param.data.float()
            param.requires_grad_(True)
