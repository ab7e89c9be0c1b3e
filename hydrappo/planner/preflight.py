"""Before a PPO run loads its model on a GPU: the planner's plan of THIS run (its own settings,
its model's real config) against the memory the device has free. A run that will not fit stops
there, seconds after its config is read, with the plan's table and the changes that would make it
fit; one that fits says so in one line. On the CPU (or any device that is not CUDA) nothing runs.

What the plan assumes of a run, and so where it can be off (docs/planner.md): one process (under
a launcher each process holds a slice of the batch, and maybe an FSDP shard of the trunk: not
planned, not checked); a reward model (reward.reward_model) counted as a reward branch (the top
layers' copy), which is smaller than a separate classifier; the peak of eager PyTorch with the
headroom of `fits` (x FRAGMENTATION). The plan was within 8% of measured runs on the CPU
(planner/validate.py). HYDRAPPO_MEMORY_CHECK=0 turns the check off, for a run the plan
misjudges.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch

from ..config import canonical_dtype
from ..errors import UsageError
from ..generation.samplers import resolve_sampler
from . import fit, plan as planner
from .counts import count_parameters
from .settings import FRAGMENTATION, GIB, TrainingSettings

logger = logging.getLogger("hydrappo.planner")

SWITCH = "HYDRAPPO_MEMORY_CHECK"  # 0: do not plan the run against the GPU


class RunWillNotFitError(UsageError):
    """The run's plan needs more GPU memory than the device has free."""


def free_gpu_bytes(device: torch.device) -> int | None:
    """Bytes free on a CUDA device now (other processes' memory taken), None on any other device.
    Reading it starts this process's CUDA context, which the trainer would start next anyway."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    free, _total = torch.cuda.mem_get_info(device)
    return free


def _weights_dtype(name: str, device: torch.device) -> str:
    """model.dtype as the run resolves it (storage/models.resolve_dtype): auto is bfloat16 on a
    GPU that has it, else float32."""
    dtype = canonical_dtype(name)
    if dtype != "auto":
        return dtype
    return "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float32"


def _planned_sampler(config, device: torch.device) -> str:
    """The planner's sampler (its KV cache is what differs): graph, decode, or generate for the rest."""
    quantized = config.model.trunk_quantization != "none"
    sampler = resolve_sampler(config.generation.sampler, device, quantized=quantized)
    return sampler if sampler in ("graph", "decode") else "generate"


def run_settings(config, device: torch.device) -> TrainingSettings:
    """The planner's settings of a `hydrappo train` config on `device`."""
    model, ppo, generation, reward = config.model, config.ppo, config.generation, config.reward
    return TrainingSettings(
        num_layers_unfrozen=model.num_layers_unfrozen,
        trainable_layers=model.trainable_layers,
        lora_rank=config.lora.lora_r,
        dtype=_weights_dtype(model.dtype, device),
        optimizer=ppo.optimizer,
        trunk_quantization=model.trunk_quantization,
        batch_size=ppo.batch_size,
        mini_batch_size=ppo.mini_batch_size,
        gradient_accumulation_steps=ppo.gradient_accumulation_steps,
        generation_batch_size=generation.generation_batch_size,
        prompt_length=config.data.max_prompt_length,
        response_length=generation.max_new_tokens,
        reward_model=bool(reward.reward_model or reward.use_reward_branch),
        train_lm_head=model.train_lm_head,
        train_final_norm=model.train_final_norm,
        gradient_checkpointing=model.gradient_checkpointing,
        entropy_in_update=ppo.ent_coef != 0,
        sampler=_planned_sampler(config, device),
    )


def _model_config(config):
    """The model's own config, as the run would load it (a GGUF file's is read from its metadata)."""
    from ..storage.models import resolve_model_source, source_config

    model = config.model
    return source_config(*resolve_model_source(model.name_or_path, model.gguf_file, model.revision))


# ---------------------------------------------------------------------------- what would fit


def train_options(given: TrainingSettings, variant: TrainingSettings) -> str:
    """The `hydrappo train` options that turn the given settings into a variant of fit.variants."""
    changes = []
    if given.reward_model and not variant.reward_model:
        changes.append("a reward function instead of a reward model (reward.reward_fn)")
    if variant.optimizer != given.optimizer:
        changes.append(f"--optimizer {variant.optimizer}")
    if variant.trunk_quantization != given.trunk_quantization:
        changes.append(f"--trunk_quantization {variant.trunk_quantization}")
    if variant.lora_rank != given.lora_rank:
        changes.append(f"--lora_r {variant.lora_rank}")
        # Only adapters train under LoRA (the config refuses a trained head or norm beside them).
        changes += [f"--{name} false" for name in ("train_lm_head", "train_final_norm") if getattr(given, name)]
    if variant.num_layers_unfrozen != given.num_layers_unfrozen:
        changes.append(f"--num_layers_unfrozen {variant.num_layers_unfrozen}")
    if variant.gradient_checkpointing != given.gradient_checkpointing:
        changes.append("--gradient_checkpointing true")
    return " ".join(changes) or "(as given)"


@dataclass(frozen=True)
class Variant:
    options: str  # the train options that select it
    peak: int  # bytes
    fits: bool


def fitting_variants(model_config, settings: TrainingSettings, name: str, free: int) -> list[Variant]:
    """The run as given and the usual ways to lower its memory (fit.variants), each with its peak."""
    counts, traces, rows = count_parameters(model_config), {}, []
    for _label, variant in fit.variants(settings):
        key = (variant.lora_rank, variant.num_layers_unfrozen == -1)  # one activation trace per LoRA rank
        plan = planner.plan_memory(model_config, variant, name, counts, traces.get(key))
        traces[key] = plan.activation
        peak = plan.hydra.peak
        rows.append(Variant(train_options(settings, variant), peak, peak * FRAGMENTATION <= free))
    return rows


def _amount(size: float) -> str:
    """GiB, or MiB under one GiB (a small model's plan would read 0.00 GiB)."""
    return f"{size / GIB:.2f} GiB" if size >= GIB else f"{size / 2**20:.1f} MiB"


def _refusal(plan: planner.MemoryPlan, variants: list[Variant], free: int, device: torch.device) -> str:
    hydra = plan.hydra
    width = max(len(row.options) for row in variants)
    table = [f"  {'options':<{width}}  peak GiB  fits"]
    table += [f"  {row.options:<{width}}  {row.peak / GIB:8.2f}  {'yes' if row.fits else 'no'}" for row in variants]
    fitting = [row.options for row in variants if row.fits]
    advice = (
        f"the first that fits: {fitting[0]}"
        if fitting
        else "none of these fits: a smaller model, shorter responses (--max_new_tokens) or a smaller --batch_size"
    )
    return (
        f"the run will not fit on {device}: its plan peaks at {_amount(hydra.peak)} ({hydra.peak_phase}), "
        f"x {FRAGMENTATION} headroom = {_amount(hydra.peak * FRAGMENTATION)}, and {device} has "
        f"{_amount(free)} free. Stopped before the model loads.\n\n"
        f"{planner.format_plan(plan)}\n\nWhat would fit ({_amount(free)} free):\n"
        + "\n".join(table)
        + f"\n{advice}.\nThe plan is an estimate (docs/planner.md); {SWITCH}=0 skips this check."
    )


def check_run_fits(config, device: torch.device) -> str | None:
    """On a CUDA device: the one-line plan of a run that fits, or RunWillNotFitError with the plan's
    table and what would fit. None on any other device, or with HYDRAPPO_MEMORY_CHECK=0."""
    if os.environ.get(SWITCH, "1") == "0":
        return None
    free = free_gpu_bytes(device)
    if free is None:
        return None
    settings = run_settings(config, device)
    model_config = _model_config(config)
    name = str(config.model.name_or_path)
    try:
        plan = planner.plan_memory(model_config, settings, name)
    except Exception as error:  # an architecture the planner cannot trace: the check is advice, the run goes on
        logger.warning("memory plan: none (%s: %s); the run goes on unchecked", type(error).__name__, error)
        return None
    hydra = plan.hydra
    if hydra.peak * FRAGMENTATION > free:
        raise RunWillNotFitError(_refusal(plan, fitting_variants(model_config, settings, name, free), free, device))
    line = (
        f"memory plan: peak {_amount(hydra.peak)} ({hydra.peak_phase}; x {FRAGMENTATION} headroom "
        f"{_amount(hydra.peak * FRAGMENTATION)}) of {_amount(free)} free on {device}; "
        f"{hydra.trainable_parameters / 1e6:,.1f}M trainable parameters, weights {settings.dtype}"
    )
    logger.info(line)
    return line
