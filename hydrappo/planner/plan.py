"""Memory planner: what a PPO run needs, component by component, with hydrappo's one-trunk
layout and with the classic four-model layout, and which GPUs it fits.

    hydrappo memory llama-3.1-8b --lora-rank 16
    hydrappo memory path/to/config.json -N 4 --batch-size 32 --response-length 512
    hydrappo memory --largest                  # every preset's peak, the largest per GPU size
    python -m hydrappo.planner.validate        # planner against measured CPU runs

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

Checked against reality with planner/validate.py (`hydrappo memory --validate`): the peak resident memory of two PPO steps of
hydrappo's trainer on the CPU (float32, N=2, batch 8, 64 + 64 tokens), planned with the CPU's
log-prob blocks (settings.device) plus the ~155 MiB the process holds once it computes: SmolLM2-135M's
shape 863 planned / 881 MiB measured, Gemma 3 270M's (vocabulary 262,144)
1476 / 1463 MiB (2026-11-28).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

import torch

from ..model.band import band_problem, describe_band, is_fraction, parse_band, resolve_band
from ..model.logprobs import CHUNK_ELEMENTS, vocab_block
from ..generation.graph_decode import bucket_of
from .activations import ActivationTrace, trace_activations
from .counts import (
    ParameterCounts,
    count_parameters,
    load_model_config,
    lora_parameters,
    reward_head_parameters,
    value_head_parameters,
)
from .presets import PRESETS
from .settings import (
    CHUNK_COPIES_EVAL,
    CHUNK_COPIES_UPDATE,
    CUDA_CONTEXT_GIB,
    FRAGMENTATION,
    GIB,
    GPU_SIZES_GIB,
    TrainingSettings,
)


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


def _chunk_elements(positions: int, vocab: int, device: str = "cuda") -> int:
    """Logits of one block of the log-prob pass: a chunk's rows times the block's vocabulary columns
    (model/logprobs.py: the whole vocabulary on a GPU, 2048 columns on the CPU)."""
    rows = min(max(1, CHUNK_ELEMENTS // max(1, vocab)), positions)
    return rows * vocab_block(rows, vocab, torch.device(device))


def _optimizer_bytes(params: int, optimizer: str, state_bytes: int) -> int:
    if optimizer == "adamw":
        return 2 * params * state_bytes
    if optimizer == "adamw8bit":
        # bitsandbytes' AdamW8bit: two uint8 moments + a float32 scale per block of 256 values each
        # (tensors under 4096 values keep float32 state: norms, biases; not worth counting apart).
        return 2 * params + 2 * 4 * -(-params // 256)
    return 0  # plain SGD keeps no state


def quantized_bytes(weights: int, rows: int, modules: int, mode: str) -> int:
    """Bytes bitsandbytes stores for `weights` values in `modules` matrices of `rows` rows in all
    (model/quantize.py): int8 (LLM.int8): 1 byte each + a float32 scale per row; 4bit (NF4, blocks
    of 64, double-quantized scales): half a byte each + a uint8 scale per 64 + a float32 per 64 x 256,
    and per matrix the 16-entry NF4 and 256-entry scale code tables and an offset (float32)."""
    if mode == "int8":
        return weights + 4 * rows
    return weights // 2 + -(-weights // 64) + 4 * -(-weights // (64 * 256)) + modules * (16 + 256 + 1) * 4


def quantized_trunk(counts: ParameterCounts, split: int, mode: str, embeddings: bool) -> tuple[int, int]:
    """(parameters replaced, bytes stored) of a trunk whose bottom `split` layers' linear maps
    (and, with `embeddings`, its input embeddings) are stored in `mode`."""
    if mode == "none" or split == 0:
        return 0, 0
    weights = sum(counts.layer_linear_weights[:split])
    if not weights:
        raise ValueError(
            "the bottom layers hold no torch.nn.Linear (e.g. GPT-2's Conv1D): bitsandbytes cannot quantize them."
        )
    stored = quantized_bytes(
        weights, sum(counts.layer_linear_rows[:split]), sum(counts.layer_linear_modules[:split]), mode
    )
    if embeddings and counts.embedding_weights:
        weights += counts.embedding_weights
        stored += quantized_bytes(counts.embedding_weights, counts.embedding_rows, 1, mode)
    return weights, stored


def _layer_workspace(counts: ParameterCounts, batch: int, length: int, wbytes: int) -> int:
    """Largest transient of one no-grad layer forward: the MLP's intermediates."""
    return batch * length * (3 * counts.intermediate_size + 4 * counts.hidden_size) * wbytes


def _trainable_layers(s: TrainingSettings, num_layers: int) -> tuple[int, int]:
    """(split, n): the first trainable layer and how many train, from the top N or a band."""
    if s.trainable_layers is not None:
        band = parse_band(s.trainable_layers)
        problem = band_problem(band, num_layers)
        if problem is not None:
            raise ValueError(f"trainable_layers {s.trainable_layers!r} {problem[0]}; {problem[1]}.")
        start, end = resolve_band(band, num_layers)
        return start, end - start
    n = num_layers if s.num_layers_unfrozen == -1 else min(s.num_layers_unfrozen, num_layers)
    if n < 0:
        raise ValueError("num_layers_unfrozen must be -1 (all layers) or >= 0.")
    return num_layers - n, n


@dataclass(frozen=True)
class _Run:
    """What both layouts' components are computed from: the model's counts, the settings, the
    traced activations, and where the trainable layers sit (`split`: the first of `trained`)."""

    counts: ParameterCounts
    settings: TrainingSettings
    trace: ActivationTrace
    split: int
    trained: int

    @property
    def num_layers(self) -> int:
        return self.counts.num_layers

    @property
    def above(self) -> int:
        """Frozen layers above a band: the update's forward runs them and its backward passes the
        gradient through them, so their activations are kept (their weights take no gradient)."""
        return self.num_layers - self.split - self.trained

    @property
    def full(self) -> bool:
        return self.trained == self.num_layers

    @property
    def lora(self) -> bool:
        return self.settings.lora_rank > 0

    @property
    def weight_bytes(self) -> int:
        return self.settings.weight_bytes

    @property
    def state_bytes(self) -> int:
        """Bytes per value of the trainable weights' optimizer state."""
        return 4 if self.settings.uses_master_weights else self.weight_bytes

    @property
    def where(self) -> str:
        if not self.above:
            return f"top {self.trained} layers"
        return f"band of {self.trained} layers ({self.split}:{self.split + self.trained})"

    @property
    def train_head(self) -> bool:
        return (self.settings.train_lm_head or self.full) and not self.lora

    @property
    def train_norm(self) -> bool:
        return (self.settings.train_final_norm or self.full) and not self.lora

    def kv_cache(self, batch: int, length: int | None = None) -> int:
        length = self.settings.seq_len if length is None else length
        return 2 * self.num_layers * batch * self.counts.kv_size * length * self.weight_bytes

    def layer_workspace(self, batch: int, length: int) -> int:
        return _layer_workspace(self.counts, batch, length, self.weight_bytes)

    @property
    def dequantized(self) -> int:
        """A quantized trunk's weight dequantized for its matmul: in every workspace of a frozen pass."""
        if self.settings.trunk_quantization == "none":
            return 0
        return 2 * self.counts.largest_linear * self.weight_bytes

    def generate_workspace(self) -> int:
        """Prefill's MLP intermediates, the next-token logits, a dequantized weight."""
        generation_batch = self.settings.generation_batch_size
        prefill = self.layer_workspace(generation_batch, self.settings.prompt_length)
        return prefill + generation_batch * self.counts.vocab_size * 4 + self.dequantized


def plan_memory(
    config,
    settings: TrainingSettings,
    model_name: str = "model",
    counts: ParameterCounts | None = None,
    trace: ActivationTrace | None = None,
) -> MemoryPlan:
    """Per-component memory of PPO with hydrappo and with the classic four-model layout. `counts`
    and `trace` reuse another plan's of the same model, shapes, dtype, LoRA rank and final norm."""
    counts = counts or count_parameters(config)
    split, trained = _trainable_layers(settings, counts.num_layers)
    if settings.trunk_quantization != "none" and trained == counts.num_layers:
        raise ValueError(
            "trunk quantization needs a frozen trunk: num_layers_unfrozen must be below the number of layers."
        )
    trace = trace or trace_activations(
        config,
        settings.micro_batch,
        settings.seq_len,
        settings.torch_dtype,
        settings.lora_rank,
        settings.train_final_norm or trained == counts.num_layers,
    )
    run = _Run(counts, settings, trace, split, trained)
    return MemoryPlan(model_name, counts, settings, _hydra_layout(run), _classic_layout(run), trace)


# --------------------------------------------------------------------------- hydrappo: one trunk


@dataclass(frozen=True)
class _Trainable:
    """What trains in the hydra and what its frozen reference copies."""

    low: int  # parameters in the weights dtype
    fp32: int  # parameters kept in float32 (value head, LoRA adapters)
    adapters: int  # LoRA parameters (0 without LoRA)
    reference: int  # parameters of the frozen reference copy
    reference_note: str


def _hydra_trainable(run: _Run) -> _Trainable:
    counts = run.counts
    value_head = value_head_parameters(counts.hidden_size)
    if run.lora:
        adapters = run.trained * lora_parameters(counts.layer_linears, run.settings.lora_rank)
        return _Trainable(0, adapters + value_head, adapters, 0, "LoRA adapters switched off: no copy")
    if run.full:
        return _Trainable(counts.total, value_head, 0, counts.total, "the whole model (all layers train)")
    top = sum(counts.layers[run.split : run.split + run.trained])
    head = counts.lm_head_size if run.train_head else 0  # the untied trainable head / hydra's frozen reference head
    norm = counts.final_norm if run.train_norm else 0
    note = run.where + (" + lm_head" if head else "") + (" + final norm" if norm else "")
    return _Trainable(top + head + norm, value_head, 0, top + head + norm, note)


def _weights_component(run: _Run) -> Component:
    """The base model's weights, the bottom layers' linear maps quantized when asked."""
    counts, quantization, weight_bytes = run.counts, run.settings.trunk_quantization, run.weight_bytes
    untied_head = counts.lm_head_size if run.train_head and counts.lm_head == 0 and not run.full else 0
    # Frozen input embeddings are quantized when nothing ties them to the lm_head (a trained head is untied).
    replaced, quantized = quantized_trunk(
        counts, run.split, quantization, embeddings=counts.lm_head > 0 or run.train_head
    )
    note = "the base model" + (" + its untied trainable lm_head" if untied_head else "")
    if quantization != "none":
        embeddings = " and input embeddings" if replaced > sum(counts.layer_linear_weights[: run.split]) else ""
        note += f"; bottom {run.split} layers' linear maps{embeddings} in {quantization} ({quantized / GIB:.2f} GiB)"
    stored = (counts.total + untied_head - replaced) * weight_bytes + quantized
    return Component("weights", stored, "static", note)


def _kv_cache_component(run: _Run) -> Component:
    """The sampler's KV cache: the graph sampler keeps one bucket's static cache (rows up to a power
    of two, length up to a multiple of 64, every layer at full length) and its split-state buffer
    between samples; the others hold theirs only while generating."""
    generation_batch, layers = run.settings.generation_batch_size, run.num_layers
    if run.settings.sampler != "graph":
        note = f"{generation_batch} sequences x {run.settings.seq_len} tokens, all {layers} layers"
        return Component("KV cache", run.kv_cache(generation_batch), "generate", note)
    rows, length = bucket_of(generation_batch, run.settings.seq_len)
    split_buffer = rows * length * run.counts.hidden_size * run.weight_bytes if not run.full else 0
    note = (
        f"the graph sampler's bucket, {rows} rows x {length} positions, all {layers} layers, "
        "and its split-state buffer, held between samples"
    )
    return Component("KV cache", run.kv_cache(rows, length) + split_buffer, "static", note)


def _hydra_static(run: _Run, trainable: _Trainable) -> list[Component]:
    """What lives all run long: weights, frozen copies, the heads, adapters, optimizer state."""
    settings, counts = run.settings, run.counts
    has_branch = settings.reward_model and not run.full and run.trained
    branch = sum(counts.layers[run.split :])  # a reward branch copies every layer from the split up
    norm_copy = counts.final_norm if run.train_norm else 0
    reward = (
        (branch + norm_copy) * run.weight_bytes + reward_head_parameters(counts.hidden_size) * 4 if has_branch else 0
    )
    master = settings.uses_master_weights
    optimizer = _optimizer_bytes(trainable.low, settings.optimizer, run.state_bytes)
    optimizer += _optimizer_bytes(trainable.fp32, settings.optimizer, 4)
    lora_note = f"rank {settings.lora_rank} on the {run.where}' linear maps, float32" if run.lora else "none"
    return [
        _weights_component(run),
        Component("reference copy", trainable.reference * run.weight_bytes, "static", trainable.reference_note),
        Component(
            "reward branch",
            reward,
            "static",
            f"top {run.num_layers - run.split} layers + scalar head" if reward else "none",
        ),
        Component("value head", value_head_parameters(counts.hidden_size) * 4, "static", "MLP h-2h-1, float32"),
        Component("LoRA adapters", trainable.adapters * 4, "static", lora_note),
        Component(
            "fp32 master weights",
            trainable.low * 4 if master else 0,
            "static",
            "of the trainable weights" if master and trainable.low else "none",
        ),
        Component("optimizer state", optimizer, "static", settings.optimizer),
    ]


def _hydra_step(run: _Run, trainable: _Trainable) -> list[Component]:
    """The three phases of a step: generation, the experience pass, the update."""
    settings, counts, trace = run.settings, run.counts, run.trace
    hidden, vocab, weight_bytes = counts.hidden_size, counts.vocab_size, run.weight_bytes
    seq_len, generation_batch, micro = settings.seq_len, settings.generation_batch_size, settings.micro_batch
    split_cache = settings.batch_size * seq_len * hidden * weight_bytes
    # generation.reuse_trunk_pass: sampling keeps every rollout's split hidden state; the
    # last chunk's steps are concatenated before its rows are cut out (x2 of one chunk).
    recorded = split_cache + 2 * generation_batch * seq_len * hidden * weight_bytes if not run.full else 0
    # Packing the recorded states (or, without a frozen split, torch.cat of the evaluation chunks).
    cat_copy = split_cache if settings.batch_size > generation_batch or not run.full else 0
    logits_eval = (
        _chunk_elements(generation_batch * settings.response_length, vocab, settings.device) * 4 * CHUNK_COPIES_EVAL
    )
    update_copies = CHUNK_COPIES_EVAL if settings.entropy_in_update else CHUNK_COPIES_UPDATE
    logits_update = _chunk_elements(micro * settings.response_length, vocab, settings.device) * 4 * update_copies
    evaluation = run.layer_workspace(generation_batch, seq_len) + 3 * generation_batch * seq_len * hidden * weight_bytes
    with_autograd = run.trained + run.above  # layers the update runs with autograd
    if settings.gradient_checkpointing:
        layer_activations = with_autograd * trace.layer_input + trace.layer
    else:
        layer_activations = with_autograd * trace.layer
    activations_note = (
        (f"{run.where} + the {run.above} frozen above" if run.above else run.where)
        + f", micro-batch {micro} x {seq_len}"
        + (", checkpointed" if settings.gradient_checkpointing else "")
    )
    recorded_note = (
        f"{settings.batch_size} rollouts, kept for the experience pass" if recorded else "none (no frozen split)"
    )
    packed_note = f"{settings.batch_size} rollouts" + (" (x2 while packed)" if cat_copy else "")
    return [
        _kv_cache_component(run),
        Component(
            "generation workspace", run.generate_workspace(), "generate", "prefill MLP intermediates, next-token logits"
        ),
        Component("recorded split states", recorded, "generate", recorded_note),
        Component("split-hidden cache", split_cache + cat_copy, "evaluate", packed_note),
        Component(
            "evaluation workspace",
            evaluation + logits_eval + run.dequantized,
            "evaluate",
            "one hydra pass, log-prob chunks with entropy",
        ),
        Component("split-hidden cache", split_cache, "update", "kept for the PPO epochs"),
        Component("gradients", trainable.low * weight_bytes + trainable.fp32 * 4, "update", "trainable parameters"),
        Component("activations", layer_activations + trace.tail, "update", activations_note),
        Component("log-prob chunks", logits_update, "update", "chunked lm_head, fused with its gradient"),
        Component("backward workspace", trace.layer // 2, "update", "gradients of one layer's activations"),
    ]


def _hydra_layout(run: _Run) -> LayoutPlan:
    trainable = _hydra_trainable(run)
    components = _hydra_static(run, trainable) + _hydra_step(run, trainable)
    return LayoutPlan("hydrappo", components, trainable.low + trainable.fp32)


# --------------------------------------------------------------------------- classic: four full models


def _classic_layout(run: _Run) -> LayoutPlan:
    settings, counts, trace = run.settings, run.counts, run.trace
    layers, weight_bytes, optimizer = run.num_layers, run.weight_bytes, settings.optimizer
    generation_batch, seq_len = settings.generation_batch_size, settings.seq_len
    reward_head = reward_head_parameters(counts.hidden_size)
    critic = counts.total - counts.lm_head  # a sequence-level model: no lm_head of its own
    if run.lora:
        adapters = 2 * layers * lora_parameters(counts.layer_linears, settings.lora_rank)
        low, fp32, reference = 0, adapters + 2 * reward_head, 0
    else:
        adapters, low, fp32, reference = 0, counts.total + critic, reward_head, counts.total
    checkpointed = settings.gradient_checkpointing
    kept_per_layer = trace.layer_input if checkpointed else trace.layer
    activations = 2 * layers * kept_per_layer + (trace.layer if checkpointed else 0) + 2 * trace.tail
    logits_bytes = (weight_bytes + 8) if weight_bytes != 4 else 8  # logits, a float32 copy, the log-softmax
    scalar_model = critic * weight_bytes + reward_head * 4
    optimizer_bytes = _optimizer_bytes(low, optimizer, run.state_bytes) + _optimizer_bytes(fp32, optimizer, 4)
    evaluation = (
        run.layer_workspace(generation_batch, seq_len) + generation_batch * seq_len * counts.vocab_size * logits_bytes
    )
    components = [
        Component("policy weights", counts.total * weight_bytes, "static", "full model"),
        Component(
            "reference model", reference * weight_bytes, "static", "full copy" if reference else "LoRA off: no copy"
        ),
        Component("value model", scalar_model, "static", "full trunk + scalar head"),
        Component(
            "reward model",
            scalar_model if settings.reward_model else 0,
            "static",
            "full trunk + scalar head" if settings.reward_model else "none",
        ),
        Component(
            "LoRA adapters",
            adapters * 4,
            "static",
            f"rank {settings.lora_rank} on all {layers} layers of policy and critic" if run.lora else "none",
        ),
        Component("fp32 master weights", low * 4 if settings.uses_master_weights else 0, "static", "policy + critic"),
        Component("optimizer state", optimizer_bytes, "static", f"{optimizer}, policy + critic"),
        Component(
            "KV cache",
            run.kv_cache(generation_batch),
            "generate",
            f"{generation_batch} sequences x {seq_len} tokens, all {layers} layers",
        ),
        Component("generation workspace", run.generate_workspace(), "generate", ""),
        Component("evaluation workspace", evaluation, "evaluate", "full-vocabulary logits of the reference / policy"),
        Component("gradients", low * weight_bytes + fp32 * 4, "update", "policy + critic"),
        Component("activations", activations, "update", f"all {layers} layers of policy and critic"),
        Component(
            "full-vocab logits",
            settings.micro_batch * seq_len * counts.vocab_size * logits_bytes,
            "update",
            "logits, float32 copy, log-softmax",
        ),
        Component("backward workspace", trace.layer // 2, "update", ""),
    ]
    return LayoutPlan("classic", components, low + fp32)


# --------------------------------------------------------------------------- output


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}K"


def _gib(value: int) -> str:
    return f"{value / GIB:7.2f}"


def _layers_label(s: TrainingSettings, num_layers: int) -> str:
    if s.trainable_layers is None:
        return f"N={s.num_layers_unfrozen}"
    if is_fraction(parse_band(s.trainable_layers)):  # the layers the fractions are on this model
        return describe_band(s.trainable_layers, num_layers)
    return f"trainable layers {s.trainable_layers}"


def format_plan(plan: MemoryPlan) -> str:
    s, c = plan.settings, plan.counts
    lines = [
        f"{plan.model}: {_count(c.total)} parameters ({c.num_layers} layers, hidden {c.hidden_size}, vocab "
        f"{c.vocab_size}, {'tied' if not c.lm_head else 'untied'} lm_head; one layer {_count(c.layers[-1])})",
        f"settings: {_layers_label(s, c.num_layers)}, {'LoRA rank ' + str(s.lora_rank) if s.lora_rank else 'full ' + ('band' if s.trainable_layers else 'top-N')}, "
        f"{s.dtype} weights{', fp32 master weights' if s.uses_master_weights else ''}, {s.optimizer}, "
        f"{'' if s.trunk_quantization == 'none' else s.trunk_quantization + ' trunk, '}"
        f"batch {s.batch_size} (mini {s.mini_batch_size}, micro {s.micro_batch}, generation {s.generation_batch_size}), "
        f"prompt {s.prompt_length} + response {s.response_length} tokens"
        f"{', reward model' if s.reward_model else ', reward function'}"
        f"{', gradient checkpointing' if s.gradient_checkpointing else ''}",
        "",
    ]
    for layout in (plan.hydra, plan.classic):
        title = (
            "hydrappo (one trunk)" if layout.layout == "hydrappo" else "classic (policy + reference + critic + reward)"
        )
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
    return {
        "model": plan.model,
        "parameters": counts,
        "settings": asdict(plan.settings),
        "hydrappo": layout(plan.hydra),
        "classic": layout(plan.classic),
    }


def preset_plans(
    settings: TrainingSettings, presets: list[str] | None = None, like: list[MemoryPlan] | None = None
) -> list[MemoryPlan]:
    """Plans of the presets (default: all), smallest model first. `like`: plans of the same presets
    under settings that differ only in optimizer or trunk quantization, whose counts and traces are reused."""
    if like is not None:
        return [plan_memory(load_model_config(p.model), settings, p.model, p.counts, p.activation) for p in like]
    plans = [plan_memory(load_model_config(name), settings, name) for name in presets or list(PRESETS)]
    return sorted(plans, key=lambda p: p.counts.total)


def largest_models(
    settings: TrainingSettings, presets: list[str] | None = None, plans: list[MemoryPlan] | None = None
) -> list[dict]:
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


def largest_variants(settings: TrainingSettings, lora_rank: int = 16) -> dict[str, list[MemoryPlan]]:
    """Every preset's plans for the columns of `hydrappo memory --largest`: full top-N as `settings`
    say, then with 8-bit AdamW, with an int8 and a 4-bit trunk (each with 8-bit AdamW), and LoRA."""
    full = preset_plans(replace(settings, lora_rank=0))
    variants = {"full top-N": full}
    for label, optimizer, quantization in (
        ("adamw8bit", "adamw8bit", "none"),
        ("int8 trunk", "adamw8bit", "int8"),
        ("4bit trunk", "adamw8bit", "4bit"),
    ):
        variant = replace(settings, lora_rank=0, optimizer=optimizer, trunk_quantization=quantization)
        variants[label] = preset_plans(variant, like=full)
    variants[f"LoRA r={lora_rank}"] = preset_plans(replace(settings, lora_rank=lora_rank))
    return variants


def format_largest(settings: TrainingSettings, lora_rank: int = 16) -> str:
    """Every preset's peak (hydrappo: full top-N, with 8-bit AdamW, with an int8 / 4-bit trunk, LoRA;
    classic: full, LoRA) and the largest preset that fits each GPU size."""
    s = settings
    lines = [
        f"N={s.num_layers_unfrozen}, {s.dtype} weights{' + fp32 master weights and optimizer state' if s.uses_master_weights else ''}, "
        f"{s.optimizer}{'' if s.trunk_quantization == 'none' else ', ' + s.trunk_quantization + ' trunk'}, batch "
        f"{s.batch_size}, mini-batch {s.mini_batch_size}, generation batch {s.generation_batch_size}, prompt "
        f"{s.prompt_length} + response {s.response_length} tokens, "
        f"{'reward branch / reward model' if s.reward_model else 'reward function'}; "
        f"fits = peak x {FRAGMENTATION} + {CUDA_CONTEXT_GIB} GiB <= card",
        "hydrappo columns: full top-N as set; with adamw8bit; an int8 / 4bit trunk (frozen bottom layers "
        "quantized) with adamw8bit; LoRA. The classic layout is planned without quantization.",
    ]
    variants = largest_variants(s, lora_rank)
    full, lora = variants["full top-N"], variants[f"LoRA r={lora_rank}"]
    columns = [(label, plans, "hydra") for label, plans in variants.items()]
    columns += [("classic full", full, "classic"), (f"classic LoRA r={lora_rank}", lora, "classic")]
    widths = [max(len(label), 8) for label, _, _ in columns]
    header = "  ".join(f"{label:>{width}}" for (label, _, _), width in zip(columns, widths))
    lines.append(f"\npeak GiB per preset:\n  {'model':<14} {'params':>7}  {header}")
    for index, plan in enumerate(full):
        cells = "  ".join(
            f"{getattr(plans[index], key).peak / GIB:>{width}.1f}" for (_, plans, key), width in zip(columns, widths)
        )
        lines.append(f"  {plan.model:<14} {plan.counts.total / 1e9:6.2f}B  {cells}")
    fits = [largest_models(s, plans=plans) for _, plans, _ in columns]
    widths = [max(len(label), 12) for label, _, _ in columns]
    lines.append(
        "\nlargest preset that fits:\n  "
        + f"{'GPU':>5}  "
        + "  ".join(f"{label:<{width}}" for (label, _, _), width in zip(columns, widths))
    )
    for row_index, size in enumerate(GPU_SIZES_GIB):
        cells = []
        for (_, _, key), rows, width in zip(columns, fits, widths):
            entry = rows[row_index][key]
            cells.append(f"{entry[0] if entry else '-':<{width}}")
        lines.append(f"  {size:>3}GB  " + "  ".join(cells))
    return "\n".join(lines)
