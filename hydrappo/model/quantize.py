"""A quantized frozen trunk: the hydra's bottom layers (and frozen untied input embeddings)
stored in 8 or 4 bits through bitsandbytes, the one module of model/ that imports it.

The frozen bottom never needs a gradient, holds most of the weights and runs once per batch:
it is what weight quantization is for (QLoRA, Dettmers et al. 2023, quantizes a frozen base
under LoRA adapters; here it sits under full-precision trainable top layers). What stays in
the training precision: the trainable top N layers, their frozen reference copy, the final
norm, the lm_head (it is the policy's and the reference's output layer), the value head and
any reward branch.

    int8  LLM.int8() weights (Dettmers et al. 2022): int8 per output row with a float32 scale.
          On CUDA the matmul is LLM.int8 (activations in fp16, outlier columns above 6.0 in
          fp16); on the CPU the weight is dequantized per call (weight-only int8).
    4bit  NF4 (Dettmers et al. 2023), blocks of 64 with double-quantized scales: about
          0.52 bytes per weight. Compute in the model's dtype.

bitsandbytes picks its kernel from `module.training` (and, for 4-bit on CPUs with AVX512-BF16,
repacks the weights permanently on the first eval forward without gradients). PPO compares
the log-probs of the rollout (eval mode) with those of the update, so every quantized module
is pinned to one mode by a forward pre-hook: the numbers do not depend on train()/eval().

Expected drift from the unquantized model (mean |delta log-prob| of the tokens of a probe
batch, tools/quant_drift.py): see the README's table. The hydra's construction probe runs
again on the quantized trunk (policy == the quantized model's own logits, reference ==
policy), so the quantized model is exactly what trains and what the reference scores.
A quantized module keeps its quantized storage in a state dict: hydrappo never writes a
quantized model (export and sft re-read the original weights), it only trains on one.
"""

from __future__ import annotations

import functools
import logging

import torch
from torch import nn

from .arch import UnsupportedModelError, heads_are_tied, output_embeddings

logger = logging.getLogger("hydrappo")

TRUNK_QUANTIZATIONS = ("none", "int8", "4bit")
NF4_BLOCKSIZE = 64
INT8_THRESHOLD = 6.0  # LLM.int8's outlier threshold (CUDA)


def bitsandbytes():
    """The bitsandbytes module, or an UnsupportedModelError that says how to install it."""
    try:
        # Its CPU backend warns at import about an optional kernel package it does not need.
        quiet = logging.getLogger("bitsandbytes")
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            import bitsandbytes as bnb
        finally:
            quiet.setLevel(level)
        # LLM.int8 on CUDA casts bf16 activations to fp16 (documented above) and says so on every call.
        logging.getLogger("bitsandbytes.autograd._functions").setLevel(logging.ERROR)
    except ImportError as error:
        raise UnsupportedModelError(
            f"a quantized trunk and the 8-bit optimizer need bitsandbytes (>=0.50, <0.51), which is not installed "
            f"({error}): `pip install 'hydrappo[quant]'` or `pip install 'bitsandbytes>=0.50.0,<0.51'`."
        ) from None
    return bnb


def _pin_training(module, args):
    module.training = True


@functools.cache
def _embedding_classes():
    bnb = bitsandbytes()

    # bitsandbytes refuses to write a quantized embedding's state dict; the module's plain
    # parameters (its quantized storage) are written instead, as for the quantized linears.
    class Embedding8bit(bnb.nn.Embedding8bit):
        _save_to_state_dict = nn.Module._save_to_state_dict

    class EmbeddingNF4(bnb.nn.EmbeddingNF4):
        _save_to_state_dict = nn.Module._save_to_state_dict

    return {"int8": Embedding8bit, "4bit": EmbeddingNF4}


def _quantized_linear(linear: nn.Linear, mode: str, device: torch.device) -> nn.Module:
    bnb = bitsandbytes()
    weight = linear.weight.detach().to("cpu")  # bitsandbytes quantizes while moving off the CPU
    bias = linear.bias is not None
    if mode == "int8":
        new = bnb.nn.Linear8bitLt(
            linear.in_features,
            linear.out_features,
            bias=bias,
            has_fp16_weights=False,
            threshold=INT8_THRESHOLD,
            device="meta",
        )
        new.weight = bnb.nn.Int8Params(weight, requires_grad=False, has_fp16_weights=False)
    else:
        new = bnb.nn.Linear4bit(
            linear.in_features,
            linear.out_features,
            bias=bias,
            compute_dtype=weight.dtype,
            quant_type="nf4",
            compress_statistics=True,
            device="meta",
        )
        new.weight = bnb.nn.Params4bit(
            weight, requires_grad=False, quant_type="nf4", blocksize=NF4_BLOCKSIZE, compress_statistics=True, module=new
        )
    if bias:
        new.bias = nn.Parameter(linear.bias.detach().to("cpu"), requires_grad=False)
    return new.to(device)


def _quantized_embedding(embedding: nn.Embedding, mode: str, device: torch.device) -> nn.Module:
    bnb = bitsandbytes()
    weight = embedding.weight.detach().to("cpu")
    new = _embedding_classes()[mode](
        embedding.num_embeddings, embedding.embedding_dim, device="meta", dtype=weight.dtype
    )
    if mode == "int8":
        new.weight = bnb.nn.Int8Params(weight, requires_grad=False, has_fp16_weights=False)
    else:
        new.weight = bnb.nn.Params4bit(
            weight, requires_grad=False, quant_type="nf4", blocksize=NF4_BLOCKSIZE, compress_statistics=True, module=new
        )
    return new.to(device)


def stored_bytes(module: nn.Module) -> int:
    """Bytes a module's parameters, buffers and quantization statistics occupy."""
    total = 0
    for tensor in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
        total += tensor.numel() * tensor.element_size()
        for extra in (getattr(tensor, "SCB", None),):
            if isinstance(extra, torch.Tensor):
                total += extra.numel() * extra.element_size()
        state = getattr(tensor, "quant_state", None)
        while state is not None:
            total += sum(
                t.numel() * t.element_size()
                for t in (state.absmax, state.code, state.offset)
                if isinstance(t, torch.Tensor)
            )
            state = state.state2
    return total


def _set_child(root: nn.Module, name: str, child: nn.Module) -> None:
    parent, _, attr = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, attr, child)


def quantize_frozen_trunk(hydra, mode: str, device: str | torch.device | None = None) -> dict:
    """Store the hydra's frozen bottom layers (every `nn.Linear` in them) and, when frozen
    and untied from the lm_head, its input embeddings in `mode` ('int8' or '4bit'), then
    move the hydra to `device` (default: where it is) and run the construction probe again.

    Quantization happens on `device` (bitsandbytes quantizes while moving weights off the
    CPU): load a large model on the CPU, and only the quantized trunk reaches the GPU.
    Returns what was quantized: {"mode", "linears", "embeddings", "bytes_before", "bytes_after"}."""
    if mode not in TRUNK_QUANTIZATIONS[1:]:
        raise UnsupportedModelError(f"trunk quantization {mode!r} is not one of: {', '.join(TRUNK_QUANTIZATIONS[1:])}.")
    if getattr(hydra, "trunk_quantization", "none") != "none":
        raise UnsupportedModelError(f"this hydra's trunk is already quantized ({hydra.trunk_quantization}).")
    if hydra.full_model or hydra.split_index == 0:
        raise UnsupportedModelError(
            "trunk quantization needs a frozen trunk: with num_layers_unfrozen=-1 (or >= the number of layers) every "
            "layer trains. Lower num_layers_unfrozen, or set model.trunk_quantization: none."
        )
    bitsandbytes()
    device = torch.device(device) if device is not None else hydra.device
    decoder = hydra.arch.decoder
    names = {id(module): name for name, module in decoder.named_modules()}
    targets = [
        module
        for layer in hydra.arch.layers[: hydra.split_index]
        for module in layer.modules()
        if type(module) is nn.Linear
    ]
    if not targets:
        raise UnsupportedModelError(
            f"{type(hydra.model).__name__}'s bottom layers hold no torch.nn.Linear (e.g. GPT-2's Conv1D): bitsandbytes "
            "cannot quantize them. Set model.trunk_quantization: none."
        )
    embedding = hydra.model.get_input_embeddings()
    quantize_embedding = (
        type(embedding) is nn.Embedding
        and embedding.max_norm is None
        and not embedding.weight.requires_grad
        and not heads_are_tied(hydra.model)
    )
    if quantize_embedding:
        targets.append(embedding)
    # What a reward branch compares to recognise its trunk (storage/reward_branch.py): the
    # original weights, not their quantized storage.
    hydra.unquantized_abs_sums = {
        f"{names[id(module)]}.{name}": param.detach().abs().sum(dtype=torch.float64).item()
        for module in targets
        if id(module) in names
        for name, param in module.named_parameters(recurse=False)
    }
    before = after = 0
    for module in targets:
        before += stored_bytes(module)
        if module is embedding:
            new = _quantized_embedding(module, mode, device)
            hydra.model.set_input_embeddings(new)
        else:
            new = _quantized_linear(module, mode, device)
            new.register_forward_pre_hook(_pin_training)
            _set_child(decoder, names[id(module)], new)
        after += stored_bytes(new)
    hydra.to(device)
    hydra.trunk_quantization = mode
    check_quantized_hydra(hydra)
    report = {
        "mode": mode,
        "linears": len(targets) - quantize_embedding,
        "embeddings": quantize_embedding,
        "bytes_before": before,
        "bytes_after": after,
    }
    logger.info(
        "%s trunk: %d linear maps of %d bottom layers%s, %.1f MiB -> %.1f MiB",
        mode,
        report["linears"],
        hydra.split_index,
        " and the input embeddings" if quantize_embedding else "",
        before / 2**20,
        after / 2**20,
    )
    return report


@torch.no_grad()
def check_quantized_hydra(hydra) -> None:
    """The construction probe on the quantized trunk: the policy's logits are the quantized
    model's own, the cached-split path gives the same, and the reference equals the policy."""
    hydra._verify()
    if hydra.shares_reference:
        return
    vocab = output_embeddings(hydra.model).weight.shape[0]
    probe = torch.randint(0, vocab, (1, 6), generator=torch.Generator().manual_seed(0)).to(hydra.device)
    out = hydra.forward_hydra(probe, torch.ones_like(probe), return_logits=True)
    scale = out.logits.abs().max().clamp(min=1.0)
    tolerance = 1e-4 if out.logits.dtype == torch.float32 else 5e-2
    if not torch.allclose(out.ref_logits.float(), out.logits.float(), atol=tolerance * scale, rtol=0):
        raise UnsupportedModelError(
            f"after quantizing {type(hydra.model).__name__}'s trunk the reference and the policy disagree at "
            "initialisation; set model.trunk_quantization: none."
        )
