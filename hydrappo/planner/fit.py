"""What fits my GPU: `hydrappo memory MODEL --gpu 24`. The plan of the settings given and of the
usual ways to lower it (a reward function instead of a reward model, 8-bit AdamW, an int8 or
4-bit trunk, LoRA, fewer trainable layers, gradient checkpointing), each with the options that
select it and whether it fits; beside them the two baselines a user compares with:

  * TRL's GRPOTrainer with a peft LoRA, as TRL users run it today, with GRPOConfig's defaults:
    `beta` 0, so no reference model, and gradient checkpointing on; no critic (GRPO), no reward
    model (reward functions); adapters on the linear maps of every layer, so backward runs through
    all of them; full-vocabulary logits.
    Derived from the classic plan with the same LoRA rank: the policy alone (its adapters,
    their gradients and optimizer state, and its activations: half of policy + critic's).
  * the classic four models (policy, reference, critic, reward model), fully trained.
"""

from __future__ import annotations

from dataclasses import replace

from .counts import count_parameters
from .plan import Component, LayoutPlan, MemoryPlan, plan_memory
from .settings import CUDA_CONTEXT_GIB, FRAGMENTATION, GIB, TrainingSettings

LORA_RANK = 16  # the rank of the LoRA rows when none is given


def variants(settings: TrainingSettings) -> list[tuple[str, TrainingSettings]]:
    """(the options that select it, settings), from the settings given to ever lower plans."""
    s, r = settings, settings.lora_rank or LORA_RANK
    light = replace(s, reward_model=False)
    rows = [
        ("(as given)", s),
        ("--no-reward-model", light),
        ("--no-reward-model --optimizer adamw8bit", replace(light, optimizer="adamw8bit")),
        (
            "--no-reward-model --optimizer adamw8bit --trunk-quantization int8",
            replace(light, optimizer="adamw8bit", trunk_quantization="int8"),
        ),
        (
            "--no-reward-model --optimizer adamw8bit --trunk-quantization 4bit",
            replace(light, optimizer="adamw8bit", trunk_quantization="4bit"),
        ),
        (f"--no-reward-model --lora-rank {r}", replace(light, lora_rank=r)),
        (
            f"--no-reward-model --lora-rank {r} --trunk-quantization 4bit",
            replace(light, lora_rank=r, trunk_quantization="4bit"),
        ),
        ("--no-reward-model -N 1", replace(light, num_layers_unfrozen=1)),
        ("--no-reward-model --gradient-checkpointing", replace(light, gradient_checkpointing=True)),
    ]
    seen, unique = [], []
    for label, variant in rows:
        if variant not in seen and (variant.num_layers_unfrozen != -1 or variant.trunk_quantization == "none"):
            seen.append(variant)
            unique.append((label, variant))
    return unique


def trl_grpo_lora(classic_lora: LayoutPlan) -> LayoutPlan:
    """TRL's GRPOTrainer + peft LoRA (beta 0), from the classic layout's plan with LoRA and no reward model."""
    halved = {"LoRA adapters", "optimizer state", "gradients", "activations"}  # policy + critic -> the policy
    dropped = {"value model", "reward model", "reference model"}
    components = [
        Component(c.name, 0 if c.name in dropped else c.bytes // 2 if c.name in halved else c.bytes, c.phase, c.note)
        for c in classic_lora.components
    ]
    return LayoutPlan("TRL GRPO + LoRA", components, classic_lora.trainable_parameters // 2)


def fitting_plans(config, settings: TrainingSettings, model_name: str) -> list[tuple[str, LayoutPlan]]:
    """(label, plan) of every variant of hydrappo (`variants`), then TRL's GRPO + LoRA and the classic layout."""
    counts, traces = count_parameters(config), {}

    def plan(variant: TrainingSettings) -> MemoryPlan:  # one activation trace per LoRA rank (and all-layers or not)
        key = (variant.lora_rank, variant.num_layers_unfrozen == -1)
        planned = plan_memory(config, variant, model_name, counts, traces.get(key))
        traces[key] = planned.activation
        return planned

    plans = [(label, plan(variant).hydra) for label, variant in variants(settings)]
    base = plan(settings)
    rank = settings.lora_rank or LORA_RANK
    lora = plan(
        replace(settings, lora_rank=rank, reward_model=False, trunk_quantization="none", gradient_checkpointing=True)
    )
    plans.append(
        (f"TRL GRPOTrainer + LoRA r={rank} (beta 0: no reference; gradient checkpointing)", trl_grpo_lora(lora.classic))
    )
    plans.append(("classic: policy + reference + critic + reward model", base.classic))
    return plans


def format_fits(config, settings: TrainingSettings, model_name: str, gpu_gib: float) -> str:
    """The table of `hydrappo memory MODEL --gpu GIB`."""
    plans = fitting_plans(config, settings, model_name)
    width = max(len(label) for label, _ in plans)
    lines = [
        f"{model_name} on a {gpu_gib:g} GB GPU (fits: peak x {FRAGMENTATION} + {CUDA_CONTEXT_GIB} GiB <= "
        f"{gpu_gib:g} GiB):",
        f"  {'hydrappo memory ' + model_name + ' ...':<{width}}  peak GiB  fits",
    ]
    for index, (label, plan) in enumerate(plans):
        if index == len(plans) - 2:
            lines.append("  baselines:")
        lines.append(f"  {label:<{width}}  {plan.peak / GIB:8.2f}  {'yes' if plan.fits(gpu_gib) else 'no'}")
    fitting = [label for label, plan in plans[:-2] if plan.fits(gpu_gib)]
    lines.append(
        f"\nhydrappo settings that fit: {len(fitting)} of {len(plans) - 2}"
        + (
            f"; the first: hydrappo memory {model_name} {fitting[0]}"
            if fitting
            else "; none: a smaller model, fewer tokens (--response-length) or a smaller --batch-size"
        )
    )
    return "\n".join(lines)
