"""Memory planner: what a PPO run needs, component by component, with hydrappo's one-trunk
layout and with the classic four-model layout, and which GPUs it fits.

    hydrappo memory llama-3.1-8b --lora-rank 16
    hydrappo memory path/to/config.json -N 4 --batch-size 32 --response-length 512
    hydrappo memory --largest                  # every preset's peak, the largest per GPU size
    hydrappo memory --validate                 # planner against measured CPU runs

What is counted exactly and what is estimated:
  * parameters (exact): the model is built on the meta device (no memory, no download) and
    its embeddings, layers, final norm and lm_head are counted;
  * activations of the trainable layers (exact for eager PyTorch): one decoder layer's
    forward is traced on the meta device under `torch.autograd.graph.saved_tensors_hooks`,
    so the bytes kept for backward are those of that architecture (RMSNorm's float32
    upcasts, rotary, repeated KV heads, the MLP's intermediates; with LoRA, peft's float32
    adapters and the float32 copies of their inputs). Attention is counted as a fused kernel
    (flash / memory-efficient SDPA: q, k, v, output, log-sum-exp, mask), which is what
    PyTorch runs on CUDA and on the CPU: the T x T score matrix is never stored;
  * KV cache, split-hidden cache, gradients, optimizer state (exact formulas);
  * workspaces (estimates): a log-prob chunk (hydrappo/logprobs.py, 2**25 float32 logits)
    peaks at CHUNK_COPIES_* copies; a no-grad layer at its MLP intermediates; backward at
    half a layer's activations.

Precision: weights in --dtype; with a 16-bit dtype the trainable weights get an fp32
master copy and fp32 optimizer state (--master-weights auto), the usual mixed-precision
recipe. The value and reward heads and LoRA adapters are float32.

The classic layout is four full models (policy, reference, critic and reward model, the
last two without an lm_head), the policy and critic fully trained (same precision recipe
and optimizer), activations of every layer of both, and full-vocabulary logits (plus a
float32 copy and the log-softmax); no ZeRO, offloading or activation checkpointing unless
asked. With LoRA, adapters go into every layer of policy and critic and the reference is
the policy with adapters off (as TRL does with peft).

Phases: memory that lives all run long (weights, frozen copies, optimizer state) plus the
largest of the three phases of a PPO step: generation (KV cache), evaluation (one hydra
pass over the rollouts, split-hidden cache built) and update (split-hidden cache,
gradients, activations of the top layers, log-prob chunks).

A GPU "fits" when peak x 1.10 + 0.75 GiB (CUDA context, allocator fragmentation) is at
most its memory. Sizes are GiB, as GPU memory is sold.

Checked against reality with --validate: the peak resident memory of two PPO steps of
hydrappo's trainer on the CPU (float32, N=2, batch 8, 64 + 64 tokens) was within 8% of
the plan for a SmolLM2-135M-shaped and a 410M Llama (plan 1022 / 2319 MiB, measured
1062 / 2516 MiB).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from torch import nn

from .arch import heads_are_tied
from .hydra import LayerStandIn

GIB = 2**30
GPU_SIZES_GIB = (8, 12, 16, 24, 48, 80)
FRAGMENTATION = 1.10
CUDA_CONTEXT_GIB = 0.75
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}  # fmt: skip
OPTIMIZERS = ("adamw", "adamw8bit", "sgd")
# Float32 copies of one logits chunk alive at the peak of a log-prob chunk: forward with
# entropy (logits, exp for logsumexp, softmax, softmax*logits) and backward (recomputed
# logits, their gradient, one temporary). See hydrappo/logprobs.py.
CHUNK_COPIES_EVAL = 4
CHUNK_COPIES_UPDATE = 3


# --------------------------------------------------------------------------- settings


@dataclass
class TrainingSettings:
    """What a PPO run keeps in memory besides the model. Lengths are in tokens."""

    num_layers_unfrozen: int = 2
    lora_rank: int = 0  # 0: full training of the top N layers; r > 0: LoRA adapters on their linear modules
    dtype: str = "bfloat16"  # weights
    master_weights: bool | None = None  # fp32 master copy of the trainable weights (None: when dtype is not fp32)
    optimizer: str = "adamw"
    batch_size: int = 16  # rollouts per PPO step (the split-hidden cache holds them all)
    mini_batch_size: int = 4
    gradient_accumulation_steps: int = 1
    generation_batch_size: int = 16
    prompt_length: int = 256
    response_length: int = 256
    reward_model: bool = True  # a reward branch on the trunk (hydra) / a reward model (classic)
    train_lm_head: bool = False
    train_final_norm: bool = False
    gradient_checkpointing: bool = False
    entropy_in_update: bool = False  # ppo.ent_coef != 0

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of: {', '.join(DTYPES)}.")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer {self.optimizer!r} is not one of: {', '.join(OPTIMIZERS)}.")
        for name in ("batch_size", "mini_batch_size", "gradient_accumulation_steps", "generation_batch_size",
                     "prompt_length", "response_length"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
        if self.lora_rank < 0:
            raise ValueError("lora_rank must be >= 0 (0: no LoRA).")
        if self.mini_batch_size % self.gradient_accumulation_steps:
            raise ValueError("mini_batch_size must be a multiple of gradient_accumulation_steps.")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def weight_bytes(self) -> int:
        return torch.finfo(self.torch_dtype).bits // 8

    @property
    def uses_master_weights(self) -> bool:
        if self.master_weights is None:
            return self.torch_dtype != torch.float32
        return self.master_weights and self.torch_dtype != torch.float32

    @property
    def micro_batch(self) -> int:
        return self.mini_batch_size // self.gradient_accumulation_steps

    @property
    def seq_len(self) -> int:
        return self.prompt_length + self.response_length


# --------------------------------------------------------------------------- configs and parameters


def load_model_config(spec: str):
    """A transformers config from a preset name, a config.json file or a model directory."""
    from transformers import AutoConfig

    from .presets import PRESETS, preset_config

    if spec.lower() in PRESETS:
        return preset_config(spec)
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".json":
        data = json.loads(path.read_text())
        if "model_type" not in data:
            raise ValueError(f"{spec}: config.json has no model_type.")
        model_type = data.pop("model_type")
        return AutoConfig.for_model(model_type, **data)
    if path.is_dir() and (path / "config.json").is_file():
        return AutoConfig.from_pretrained(str(path))
    raise ValueError(
        f"{spec!r} is neither a preset ({', '.join(sorted(PRESETS))}) nor a config.json file nor a model directory "
        "with a config.json."
    )


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

    def top(self, n: int) -> int:
        return sum(self.layers[len(self.layers) - n :]) if n else 0


def count_parameters(config) -> ParameterCounts:
    """Count the parameters of `config`'s causal LM exactly, on the meta device."""
    from .arch import locate, output_embeddings

    model = meta_model(config)
    arch = locate(model)
    head = output_embeddings(model)
    tied = heads_are_tied(model)
    layers = [_numel(layer) for layer in arch.layers]
    final_norm = _numel(arch.final_norm)
    lm_head = 0 if tied else _numel(head)
    total = _numel(model)
    text = model.config.get_text_config()
    heads = getattr(text, "num_attention_heads")
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or arch.hidden_size // heads
    intermediate = getattr(text, "intermediate_size", None) or getattr(text, "n_inner", None) or 4 * arch.hidden_size
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
    )


def value_head_parameters(hidden: int) -> int:
    """hydrappo's ValueHead: Linear(h, 2h) + ReLU + Linear(2h, 1)."""
    return hidden * 2 * hidden + 2 * hidden + 2 * hidden + 1


def reward_head_parameters(hidden: int) -> int:
    return hidden + 1


def lora_parameters(linears: list[tuple[int, int]], rank: int) -> int:
    return sum(rank * (n_in + n_out) for n_in, n_out in linears)


# --------------------------------------------------------------------------- activation tracing


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


def trace_activations(config, batch: int, seq_len: int, dtype: torch.dtype, lora_rank: int = 0,
                      train_final_norm: bool = False) -> ActivationTrace:  # fmt: skip
    """Bytes autograd keeps during hydrappo's update for one micro-batch of `batch` x `seq_len`.

    The top layer's call arguments (masks, rotary embeddings, ...) come from the model's own
    decoder forward on a one-layer copy of the config with a 16-token vocabulary, run on the
    CPU (nothing but the embeddings is materialised); the layer itself then runs on the meta
    device with the saved-tensor hooks counting."""
    from .arch import locate
    from .heads import ValueHead
    from .hydra import position_ids_from_mask

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


# --------------------------------------------------------------------------- the plan


@dataclass
class Component:
    name: str
    bytes: int
    phase: str  # static | generate | evaluate | update
    note: str = ""


@dataclass
class LayoutPlan:
    layout: str
    components: list[Component]
    trainable_parameters: int

    def phase_bytes(self, phase: str) -> int:
        return sum(c.bytes for c in self.components if c.phase == phase)

    @property
    def static(self) -> int:
        return self.phase_bytes("static")

    @property
    def peak_phase(self) -> str:
        return max(("generate", "evaluate", "update"), key=self.phase_bytes)

    @property
    def peak(self) -> int:
        return self.static + self.phase_bytes(self.peak_phase)

    def fits(self, gib: float) -> bool:
        return self.peak * FRAGMENTATION + CUDA_CONTEXT_GIB * GIB <= gib * GIB

    def smallest_gpu(self) -> int | None:
        return next((size for size in GPU_SIZES_GIB if self.fits(size)), None)


@dataclass
class MemoryPlan:
    model: str
    counts: ParameterCounts
    settings: TrainingSettings
    hydra: LayoutPlan
    classic: LayoutPlan
    activation: ActivationTrace = field(repr=False)


def _chunk_elements(positions: int, vocab: int) -> int:
    from .logprobs import CHUNK_ELEMENTS

    chunk_tokens = max(1, CHUNK_ELEMENTS // max(1, vocab))
    return min(chunk_tokens, positions) * vocab


def _optimizer_bytes(params: int, optimizer: str, state_bytes: int) -> int:
    if optimizer == "adamw":
        return 2 * params * state_bytes
    if optimizer == "adamw8bit":
        return 2 * params + 2 * params * 4 // 2048  # int8 states + one float32 scale per 2048-element block
    return 0  # plain SGD keeps no state


def _layer_workspace(counts: ParameterCounts, batch: int, length: int, wbytes: int) -> int:
    """Largest transient of one no-grad layer forward: the MLP's intermediates."""
    return batch * length * (3 * counts.intermediate_size + 4 * counts.hidden_size) * wbytes


def plan_memory(config, settings: TrainingSettings, model_name: str = "model",
                counts: ParameterCounts | None = None) -> MemoryPlan:  # fmt: skip
    """Per-component memory of PPO with hydrappo and with the classic four-model layout."""
    counts = counts or count_parameters(config)
    s = settings
    n = counts.num_layers if s.num_layers_unfrozen == -1 else min(s.num_layers_unfrozen, counts.num_layers)
    if n < 0:
        raise ValueError("num_layers_unfrozen must be -1 (all layers) or >= 0.")
    full = n == counts.num_layers
    w = s.weight_bytes
    h, v, L = counts.hidden_size, counts.vocab_size, counts.num_layers
    T, R = s.seq_len, s.response_length
    micro, gen = s.micro_batch, s.generation_batch_size
    lora = s.lora_rank > 0
    trace = trace_activations(config, micro, T, s.torch_dtype, s.lora_rank, s.train_final_norm or full)
    top = counts.top(n)
    train_head = (s.train_lm_head or full) and not lora
    train_norm = (s.train_final_norm or full) and not lora
    head_copy = counts.lm_head_size if train_head else 0  # hydra's reference (frozen) head / the untied trainable one
    norm_copy = counts.final_norm if train_norm else 0
    vh = value_head_parameters(h)
    state_bytes = 4 if s.uses_master_weights else w

    def kv_cache(batch):
        return 2 * L * batch * counts.kv_size * T * w

    logits_eval = _chunk_elements(gen * R, v) * 4 * CHUNK_COPIES_EVAL
    logits_update = _chunk_elements(micro * R, v) * 4 * (CHUNK_COPIES_EVAL if s.entropy_in_update else CHUNK_COPIES_UPDATE)
    generate_workspace = _layer_workspace(counts, gen, s.prompt_length, w) + gen * v * 4
    split_cache = s.batch_size * T * h * w
    cat_copy = split_cache if s.batch_size > gen else 0  # torch.cat of the evaluation chunks

    # ---------------------------------------------------------------- hydrappo
    untied_head = counts.lm_head_size if train_head and counts.lm_head == 0 and not full else 0
    if lora:
        adapters = n * lora_parameters(counts.layer_linears, s.lora_rank)
        trainable_low, trainable_fp32 = 0, adapters + vh
        reference = 0
        reference_note = "LoRA adapters switched off: no copy"
    elif full:
        trainable_low, trainable_fp32 = counts.total, vh
        reference = counts.total
        reference_note = "the whole model (all layers train)"
    else:
        trainable_low = top + (counts.lm_head_size if train_head else 0) + norm_copy
        trainable_fp32 = vh
        reference = top + head_copy + norm_copy
        reference_note = f"top {n} layers" + (" + lm_head" if head_copy else "") + (" + final norm" if norm_copy else "")
    reward = (top + norm_copy) * w + reward_head_parameters(h) * 4 if s.reward_model and not full and n else 0
    layers_act = (n * trace.layer_input + trace.layer) if s.gradient_checkpointing else n * trace.layer
    grads = trainable_low * w + trainable_fp32 * 4
    hydra = [
        Component("weights", (counts.total + untied_head) * w, "static",
                  "the base model" + (" + its untied trainable lm_head" if untied_head else "")),
        Component("reference copy", reference * w, "static", reference_note),
        Component("reward branch", reward, "static", f"top {n} layers + scalar head" if reward else "none"),
        Component("value head", vh * 4, "static", "MLP h-2h-1, float32"),
        Component("LoRA adapters", (adapters if lora else 0) * 4, "static",
                  f"rank {s.lora_rank} on the top {n} layers' linear maps, float32" if lora else "none"),
        Component("fp32 master weights", trainable_low * 4 if s.uses_master_weights else 0, "static",
                  "of the trainable weights" if s.uses_master_weights and trainable_low else "none"),
        Component("optimizer state", _optimizer_bytes(trainable_low, s.optimizer, state_bytes)
                  + _optimizer_bytes(trainable_fp32, s.optimizer, 4), "static", s.optimizer),
        Component("KV cache", kv_cache(gen), "generate", f"{gen} sequences x {T} tokens, all {L} layers"),
        Component("generation workspace", generate_workspace, "generate", "prefill MLP intermediates, next-token logits"),
        Component("split-hidden cache", split_cache + cat_copy, "evaluate",
                  f"{s.batch_size} rollouts" + (" (x2 while concatenated)" if cat_copy else "")),
        Component("evaluation workspace", _layer_workspace(counts, gen, T, w) + 3 * gen * T * h * w + logits_eval,
                  "evaluate", "one hydra pass, log-prob chunks with entropy"),
        Component("split-hidden cache", split_cache, "update", "kept for the PPO epochs"),
        Component("gradients", grads, "update", "trainable parameters"),
        Component("activations", layers_act + trace.tail, "update",
                  f"top {n} layers, micro-batch {micro} x {T}" + (", checkpointed" if s.gradient_checkpointing else "")),
        Component("log-prob chunks", logits_update, "update", "chunked lm_head, recomputed in backward"),
        Component("backward workspace", trace.layer // 2, "update", "gradients of one layer's activations"),
    ]
    hydra_plan = LayoutPlan("hydrappo", hydra, trainable_low + trainable_fp32)

    # ---------------------------------------------------------------- classic: four full models
    critic = counts.total - counts.lm_head  # a sequence-level model: no lm_head of its own
    if lora:
        adapters_classic = 2 * L * lora_parameters(counts.layer_linears, s.lora_rank)
        low_classic, fp32_classic = 0, adapters_classic + 2 * reward_head_parameters(h)
        ref_classic = 0
    else:
        low_classic = counts.total + critic
        fp32_classic = reward_head_parameters(h)
        ref_classic = counts.total
    full_trace_layers = trace.layer if not s.gradient_checkpointing else trace.layer_input
    act_classic = 2 * L * full_trace_layers + (trace.layer if s.gradient_checkpointing else 0) + 2 * trace.tail
    logits_bytes = (w + 8) if w != 4 else 8
    classic = [
        Component("policy weights", counts.total * w, "static", "full model"),
        Component("reference model", ref_classic * w, "static", "full copy" if ref_classic else "LoRA off: no copy"),
        Component("value model", critic * w + reward_head_parameters(h) * 4, "static", "full trunk + scalar head"),
        Component("reward model", (critic * w + reward_head_parameters(h) * 4) if s.reward_model else 0, "static",
                  "full trunk + scalar head" if s.reward_model else "none"),
        Component("LoRA adapters", (adapters_classic if lora else 0) * 4, "static",
                  f"rank {s.lora_rank} on all {L} layers of policy and critic" if lora else "none"),
        Component("fp32 master weights", low_classic * 4 if s.uses_master_weights else 0, "static", "policy + critic"),
        Component("optimizer state", _optimizer_bytes(low_classic, s.optimizer, state_bytes)
                  + _optimizer_bytes(fp32_classic, s.optimizer, 4), "static", f"{s.optimizer}, policy + critic"),
        Component("KV cache", kv_cache(gen), "generate", f"{gen} sequences x {T} tokens, all {L} layers"),
        Component("generation workspace", generate_workspace, "generate", ""),
        Component("evaluation workspace", _layer_workspace(counts, gen, T, w) + gen * T * v * logits_bytes, "evaluate",
                  "full-vocabulary logits of the reference / policy"),
        Component("gradients", low_classic * w + fp32_classic * 4, "update", "policy + critic"),
        Component("activations", act_classic, "update", f"all {L} layers of policy and critic"),
        Component("full-vocab logits", micro * T * v * logits_bytes, "update", "logits, float32 copy, log-softmax"),
        Component("backward workspace", trace.layer // 2, "update", ""),
    ]
    classic_plan = LayoutPlan("classic", classic, low_classic + fp32_classic)
    return MemoryPlan(model_name, counts, settings, hydra_plan, classic_plan, trace)


# --------------------------------------------------------------------------- output


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}K"


def _gib(value: int) -> str:
    return f"{value / GIB:7.2f}"


def format_plan(plan: MemoryPlan) -> str:
    s, c = plan.settings, plan.counts
    lines = [
        f"{plan.model}: {_count(c.total)} parameters ({c.num_layers} layers, hidden {c.hidden_size}, vocab "
        f"{c.vocab_size}, {'tied' if not c.lm_head else 'untied'} lm_head; one layer {_count(c.layers[-1])})",
        f"settings: N={s.num_layers_unfrozen}, {'LoRA rank ' + str(s.lora_rank) if s.lora_rank else 'full top-N'}, "
        f"{s.dtype} weights{', fp32 master weights' if s.uses_master_weights else ''}, {s.optimizer}, "
        f"batch {s.batch_size} (mini {s.mini_batch_size}, micro {s.micro_batch}, generation {s.generation_batch_size}), "
        f"prompt {s.prompt_length} + response {s.response_length} tokens"
        f"{', reward model' if s.reward_model else ', reward function'}"
        f"{', gradient checkpointing' if s.gradient_checkpointing else ''}",
        "",
    ]
    for layout in (plan.hydra, plan.classic):
        title = "hydrappo (one trunk)" if layout.layout == "hydrappo" else "classic (policy + reference + critic + reward)"
        lines.append(f"{title}: {layout.trainable_parameters / 1e6:,.1f}M trainable parameters")
        lines.append(f"  {'component':<24} {'phase':<9} {'GiB':>7}  note")
        for comp in layout.components:
            if comp.bytes:
                lines.append(f"  {comp.name:<24} {comp.phase:<9} {_gib(comp.bytes)}  {comp.note}")
        lines.append(
            f"  {'peak':<24} {layout.peak_phase:<9} {_gib(layout.peak)}  = always-resident {layout.static / GIB:.2f} + "
            f"{layout.peak_phase} {layout.phase_bytes(layout.peak_phase) / GIB:.2f}"
        )
        fits = "  ".join(f"{size}GB:{'yes' if layout.fits(size) else 'no'}" for size in GPU_SIZES_GIB)
        lines.append(f"  fits (peak x {FRAGMENTATION} + {CUDA_CONTEXT_GIB} GiB): {fits}")
        lines.append("")
    ratio = plan.classic.peak / plan.hydra.peak
    lines.append(f"classic / hydrappo peak: {ratio:.1f}x")
    return "\n".join(lines)


def plan_to_dict(plan: MemoryPlan) -> dict:
    def layout(p: LayoutPlan) -> dict:
        return {
            "components": [asdict(c) for c in p.components],
            "static_bytes": p.static,
            "peak_phase": p.peak_phase,
            "peak_bytes": p.peak,
            "trainable_parameters": p.trainable_parameters,
            "fits_gib": {str(size): p.fits(size) for size in GPU_SIZES_GIB},
        }

    counts = asdict(plan.counts)
    counts.pop("layer_linears")
    return {"model": plan.model, "parameters": counts, "settings": asdict(plan.settings),
            "hydrappo": layout(plan.hydra), "classic": layout(plan.classic)}  # fmt: skip


def preset_plans(settings: TrainingSettings, presets: list[str] | None = None) -> list[MemoryPlan]:
    """Plans of the presets (default: all), smallest model first."""
    from .presets import PRESETS

    plans = [plan_memory(load_model_config(name), settings, name) for name in presets or list(PRESETS)]
    return sorted(plans, key=lambda p: p.counts.total)


def largest_models(settings: TrainingSettings, presets: list[str] | None = None,
                   plans: list[MemoryPlan] | None = None) -> list[dict]:  # fmt: skip
    """For each GPU size, the largest preset (by parameters) that fits, for hydrappo and classic."""
    plans = plans if plans is not None else preset_plans(settings, presets)
    rows = []
    for size in GPU_SIZES_GIB:
        row = {"gpu_gib": size}
        for key in ("hydra", "classic"):
            fitting = [p for p in plans if getattr(p, key).fits(size)]
            row[key] = (fitting[-1].model, getattr(fitting[-1], key).peak) if fitting else None
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- validation against a measured run


VALIDATION_MODELS = {
    # SmolLM2-135M's shape (preset), and a ~400M Llama.
    "smollm2-135m": None,
    "llama-400m": dict(
        model_type="llama", hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
        num_key_value_heads=8, head_dim=64, vocab_size=32000, max_position_embeddings=4096, tie_word_embeddings=True,
    ),
}


def validation_config(name: str):
    from transformers import AutoConfig

    from .presets import preset_config

    values = VALIDATION_MODELS[name]
    if values is None:
        return preset_config(name)
    values = dict(values)
    return AutoConfig.for_model(values.pop("model_type"), **values)


def validation_settings(**overrides) -> TrainingSettings:
    """What --validate runs on the CPU: float32, one PPO step of hydrappo's trainer."""
    values = dict(num_layers_unfrozen=2, dtype="float32", optimizer="adamw", batch_size=8, mini_batch_size=4,
                  generation_batch_size=8, prompt_length=64, response_length=64, reward_model=False)  # fmt: skip
    values.update(overrides)
    return TrainingSettings(**values)


def unique_bytes(tensors) -> int:
    """Bytes of the distinct tensors among `tensors` (a tied weight counts once)."""
    seen, total = set(), 0
    for tensor in tensors:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            total += tensor.numel() * tensor.element_size()
    return total


def _peak_rss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _validation_reward(samples, prompts, outputs):
    return [len(o) / 100.0 for o in outputs]


def _measure_child(name: str, settings: dict) -> dict:
    """In a fresh process: peak RSS of building the hydra and two PPO steps, minus the RSS after imports."""
    import tempfile

    from transformers import AutoModelForCausalLM

    from .config import Config, DataArgs, GenerationArgs, ModelConfig, PPOArgs, RewardArgs, TrainArgs
    from .hydra import HydraModel
    from .trainer import PPOTrainer

    s = TrainingSettings(**settings)
    torch.manual_seed(0)
    config = validation_config(name)
    vocab = config.get_text_config().vocab_size
    tokenizer = _word_tokenizer(vocab)
    tmp = tempfile.mkdtemp()
    with open(os.path.join(tmp, "prompts.jsonl"), "w") as handle:
        generator = torch.Generator().manual_seed(0)
        for _ in range(s.batch_size):
            words = torch.randint(4, vocab, (s.prompt_length,), generator=generator)
            handle.write(json.dumps({"prompt": " ".join(f"w{int(i)}" for i in words)}) + "\n")
    cfg = Config(
        model=ModelConfig(num_layers_unfrozen=s.num_layers_unfrozen, dtype=s.dtype),
        generation=GenerationArgs(max_new_tokens=s.response_length, min_new_tokens=s.response_length,
                                  generation_batch_size=s.generation_batch_size),
        ppo=PPOArgs(batch_size=s.batch_size, mini_batch_size=s.mini_batch_size, ppo_epochs=1,
                    gradient_accumulation_steps=s.gradient_accumulation_steps),
        reward=RewardArgs(reward_fn="hydrappo.memory:_validation_reward"),
        data=DataArgs(prompts=os.path.join(tmp, "prompts.jsonl"), max_prompt_length=s.prompt_length),
        train=TrainArgs(output_dir=os.path.join(tmp, "out"), device="cpu", mixed_precision="no", progress_bar=False),
    )  # fmt: skip
    baseline = _peak_rss_bytes()

    config._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(config, dtype=s.torch_dtype).eval()
    model.config.pad_token_id = tokenizer.pad_token_id
    hydra = HydraModel(model, s.num_layers_unfrozen)
    trainer = PPOTrainer(cfg, hydra=hydra, tokenizer=tokenizer)
    after_build = _peak_rss_bytes()
    trainer.train_step()
    # The optimizer state exists from the first step on: the second step is the steady
    # state. Its phases are measured one by one where the kernel lets us reset the peak.
    phases: dict[str, int] = {}
    if _reset_peak():
        import hydrappo.trainer as trainer_module

        def measured(function, label):
            def wrapper(*args, **kwargs):
                _reset_peak()
                try:
                    return function(*args, **kwargs)
                finally:
                    phases[label] = _current_peak() - baseline

            return wrapper

        trainer_module.generate_responses = measured(trainer_module.generate_responses, "generate")
        trainer_module.evaluate_sequences = measured(trainer_module.evaluate_sequences, "evaluate")
        trainer.ppo_update = measured(trainer.ppo_update, "update")
    trainer.train_step()
    return {"baseline": baseline, "build": after_build - baseline, "peak": _peak_rss_bytes() - baseline, "phases": phases}


def _reset_peak() -> bool:
    """Reset the process's peak resident size (Linux: /proc/self/clear_refs, value 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def _current_peak() -> int:
    import re

    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) * 1024


def _measure_main() -> None:
    """Entry point of the measuring child process: JSON in on stdin, JSON out on the last stdout line."""
    request = json.loads(sys.stdin.read())
    result = _measure_child(request["name"], request["settings"])
    print("\n" + json.dumps(result))


def _word_tokenizer(vocab_size: int):
    """A word-level tokenizer whose ids cover the whole vocabulary ('w4' .. 'wN')."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3}
    vocab.update({f"w{i}": i for i in range(4, vocab_size)})
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>")
    tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def measure(name: str, settings: TrainingSettings, timeout: float = 1800) -> dict:
    """Run two measured PPO steps of `name` in a child process; returns bytes."""
    import subprocess

    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    result = subprocess.run(
        [sys.executable, "-c", "from hydrappo.memory import _measure_main; _measure_main()"],
        input=json.dumps({"name": name, "settings": asdict(settings)}),
        capture_output=True, text=True, timeout=timeout, env=env,
    )
    if result.returncode != 0:
        raise RuntimeError(f"measuring {name} failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def validate(models: list[str] | None = None, settings: TrainingSettings | None = None, tolerance: float = 0.20) -> list[dict]:
    """Planner's hydrappo peak against the measured peak RSS of one PPO step on this CPU."""
    settings = settings or validation_settings()
    rows = []
    for name in models or list(VALIDATION_MODELS):
        plan = plan_memory(validation_config(name), settings, name)
        measured = measure(name, settings)
        predicted = plan.hydra.peak
        error = predicted / measured["peak"] - 1
        rows.append({"model": name, "parameters": plan.counts.total, "predicted": predicted,
                     "measured": measured["peak"], "measured_build": measured["build"], "error": error,
                     "within": abs(error) <= tolerance, "plan": plan, "measured_phases": measured.get("phases", {}),
                     "planned_phases": {phase: plan.hydra.static + plan.hydra.phase_bytes(phase)
                                        for phase in ("generate", "evaluate", "update")}})  # fmt: skip
    return rows


# --------------------------------------------------------------------------- command line


def build_parser(prog: str = "hydrappo memory") -> argparse.ArgumentParser:
    from .presets import PRESETS

    parser = argparse.ArgumentParser(
        prog=prog,
        description="Plan the GPU memory of PPO-RLHF with hydrappo (one trunk) and with the classic four-model "
        "layout, per component, and list the GPU sizes it fits.",
        epilog=f"presets: {', '.join(PRESETS)}\n\n" + "\n".join(__doc__.split("\n\n")[1:2]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", nargs="?", help="a preset name, a config.json or a model directory")
    d = TrainingSettings()
    parser.add_argument("-N", "--num-layers-unfrozen", type=int, default=d.num_layers_unfrozen, help="trainable top layers (-1: all)")
    parser.add_argument("--lora-rank", type=int, default=0, help="LoRA adapters of this rank on the top N layers (0: full training)")
    parser.add_argument("--dtype", default=d.dtype, choices=sorted(DTYPES), help="weights dtype")
    parser.add_argument("--master-weights", choices=("auto", "yes", "no"), default="auto",
                        help="fp32 master copy + fp32 optimizer state of trainable weights (auto: when dtype is not fp32)")
    parser.add_argument("--optimizer", default=d.optimizer, choices=OPTIMIZERS)
    parser.add_argument("--batch-size", type=int, default=d.batch_size, help="rollouts per PPO step")
    parser.add_argument("--mini-batch-size", type=int, default=d.mini_batch_size)
    parser.add_argument("--gradient-accumulation-steps", type=int, default=d.gradient_accumulation_steps)
    parser.add_argument("--generation-batch-size", type=int, default=d.generation_batch_size)
    parser.add_argument("--prompt-length", type=int, default=d.prompt_length)
    parser.add_argument("--response-length", type=int, default=d.response_length)
    parser.add_argument("--no-reward-model", action="store_true", help="a reward function scores (no reward branch/model)")
    parser.add_argument("--train-lm-head", action="store_true")
    parser.add_argument("--train-final-norm", action="store_true")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--entropy", action="store_true", help="an entropy bonus in the update (ppo.ent_coef != 0)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument("--largest", action="store_true", help="peak of every preset and the largest that fits each GPU size, full top-N and LoRA (rank --lora-rank, default 16)")
    parser.add_argument("--validate", action="store_true",
                        help="measure two PPO steps on this CPU (float32) of a 135M and a 410M model against the plan (minutes)")
    return parser


def settings_from_args(args) -> TrainingSettings:
    return TrainingSettings(
        num_layers_unfrozen=args.num_layers_unfrozen,
        lora_rank=args.lora_rank,
        dtype=args.dtype,
        master_weights={"auto": None, "yes": True, "no": False}[args.master_weights],
        optimizer=args.optimizer,
        batch_size=args.batch_size,
        mini_batch_size=args.mini_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        generation_batch_size=args.generation_batch_size,
        prompt_length=args.prompt_length,
        response_length=args.response_length,
        reward_model=not args.no_reward_model,
        train_lm_head=args.train_lm_head,
        train_final_norm=args.train_final_norm,
        gradient_checkpointing=args.gradient_checkpointing,
        entropy_in_update=args.entropy,
    )


def _print_largest(settings: TrainingSettings, lora_rank: int = 16) -> None:
    s = settings
    print(f"N={s.num_layers_unfrozen}, {s.dtype} weights{' + fp32 master weights and optimizer state' if s.uses_master_weights else ''}, "
          f"{s.optimizer}, batch {s.batch_size}, mini-batch {s.mini_batch_size}, generation batch "
          f"{s.generation_batch_size}, prompt {s.prompt_length} + response {s.response_length} tokens, "
          f"{'reward branch / reward model' if s.reward_model else 'reward function'}; "
          f"fits = peak x {FRAGMENTATION} + {CUDA_CONTEXT_GIB} GiB <= card")  # fmt: skip
    full = preset_plans(replace(s, lora_rank=0))
    lora = preset_plans(replace(s, lora_rank=lora_rank))
    print(f"\npeak GiB per preset:\n  {'model':<14} {'params':>7}  {'hydrappo':>9} {'LoRA r=' + str(lora_rank):>9}"
          f"  {'classic':>9} {'LoRA r=' + str(lora_rank):>9}")  # fmt: skip
    for f_plan, l_plan in zip(full, lora):
        print(f"  {f_plan.model:<14} {f_plan.counts.total / 1e9:6.2f}B  {f_plan.hydra.peak / GIB:9.1f} "
              f"{l_plan.hydra.peak / GIB:9.1f}  {f_plan.classic.peak / GIB:9.1f} {l_plan.classic.peak / GIB:9.1f}")  # fmt: skip

    def cell(entry):
        return entry[0] if entry else "-"

    print(f"\nlargest preset that fits:\n  {'GPU':>5}  {'hydrappo full top-N':<20} {'hydrappo LoRA':<20} "
          f"{'classic full':<20} {'classic LoRA':<20}")  # fmt: skip
    for f_row, l_row in zip(largest_models(s, plans=full), largest_models(s, plans=lora)):
        print(f"  {f_row['gpu_gib']:>3}GB  {cell(f_row['hydra']):<20} {cell(l_row['hydra']):<20} "
              f"{cell(f_row['classic']):<20} {cell(l_row['classic']):<20}")  # fmt: skip


def main(argv: list[str] | None = None, prog: str = "hydrappo memory") -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        settings = settings_from_args(args)
    except ValueError as error:
        print(f"hydrappo memory: {error}", file=sys.stderr)
        return 2
    import logging

    logging.getLogger("transformers").setLevel(logging.ERROR)
    if args.validate:
        rows = validate(settings=validation_settings())
        s = validation_settings()
        print(f"one PPO step (two measured, steady state) on this CPU: float32, N={s.num_layers_unfrozen}, batch {s.batch_size}, "
              f"mini-batch {s.mini_batch_size}, prompt {s.prompt_length} + response {s.response_length}, adamw, "
              "reward function")  # fmt: skip
        print(f"  {'model':<14} {'params':>8} {'phase':<9} {'planned':>10} {'measured':>10} {'error':>7}")
        for row in rows:
            print(f"  {row['model']:<14} {row['parameters'] / 1e6:7.0f}M {'peak':<9} {row['predicted'] / 2**20:7.0f}MiB "
                  f"{row['measured'] / 2**20:7.0f}MiB {row['error']:+7.1%} {'ok' if row['within'] else 'OFF'}")  # fmt: skip
            for phase, measured in row["measured_phases"].items():
                planned = row["planned_phases"][phase]
                print(f"  {'':<14} {'':>8} {phase:<9} {planned / 2**20:7.0f}MiB {measured / 2**20:7.0f}MiB "
                      f"{planned / measured - 1:+7.1%}")  # fmt: skip
        for row in rows:
            print()
            print(format_plan(row["plan"]).split("\n\nclassic")[0])
        return 0 if all(row["within"] for row in rows) else 1
    if args.largest:
        _print_largest(settings, args.lora_rank or 16)
        return 0
    if not args.model:
        parser.print_help()
        return 2
    try:
        config = load_model_config(args.model)
    except (ValueError, OSError) as error:
        print(f"hydrappo memory: {error}", file=sys.stderr)
        return 2
    plan = plan_memory(config, settings, args.model)
    print(json.dumps(plan_to_dict(plan), indent=2) if args.json else format_plan(plan))
    return 0


if __name__ == "__main__":
    sys.exit(main())
