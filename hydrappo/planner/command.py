"""`hydrappo memory`: the planner's command line. Its options are the planner's TrainingSettings
spelt with dashes (their defaults are the settings' defaults); the model is a preset name, a
config.json, or anything `hydrappo train` takes as model.name_or_path (counts.load_model_config).

    hydrappo memory MODEL [options]          the plan, component by component
    hydrappo memory MODEL --gpu 24           which settings fit a 24 GiB card
    hydrappo memory --largest                every preset's peak, the largest per GPU size
    hydrappo memory --validate               planner/validate.py: the plan against measured runs
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import dataclass
from typing import Literal

from ..config.command_line import argument, command_parser, options_from
from ..model.quantize import TRUNK_QUANTIZATIONS
from . import fit, plan as planner
from .counts import load_model_config
from .presets import PRESETS
from .settings import DTYPES, OPTIMIZERS, SAMPLERS, TrainingSettings

PROG = "hydrappo memory"
DEFAULTS = TrainingSettings()


# ---------------------------------------------------------------------------- the options
# Spelt with dashes (--batch-size); the model, then which layers train and how, the shapes of one
# PPO step and what runs in it, and what to print instead of the plan's table.


@dataclass
class MemoryOptions:
    model: str | None = argument(
        None,
        "a preset name, a config.json, or a model as `hydrappo train` takes it (a model directory, a .gguf "
        "file, a bundled name, a cached Hub id)",
        positional=True,
        nargs="?",
    )
    # Which layers train: the top N or a band (two ways to say it, so exclusive), LoRA, precision.
    num_layers_unfrozen: int | None = argument(
        None,
        f"trainable top layers (-1: all; default {DEFAULTS.num_layers_unfrozen})",
        names=("-N",),
        exclusive="layers",
    )
    trainable_layers: str | None = argument(
        None,
        "a band of trainable layers instead of the top N (0-based, END exclusive, e.g. 12:16; or fractions of "
        "the depth, e.g. 0.43:0.57)",
        metavar="START:END",
        exclusive="layers",
    )
    lora_rank: int = argument(0, "LoRA adapters of this rank on the top N layers (0: full training)")
    dtype: str = argument(DEFAULTS.dtype, "weights dtype", choices=sorted(DTYPES))
    master_weights: Literal["auto", "yes", "no"] = argument(
        "auto", "fp32 master copy + fp32 optimizer state of trainable weights (auto: when dtype is not fp32)"
    )
    optimizer: str = argument(DEFAULTS.optimizer, "the optimizer", choices=OPTIMIZERS)
    trunk_quantization: str = argument(
        DEFAULTS.trunk_quantization,
        "the frozen bottom layers (and frozen untied input embeddings) in int8 / 4bit",
        choices=TRUNK_QUANTIZATIONS,
    )
    # The shapes of one PPO step, and what runs in it.
    batch_size: int = argument(DEFAULTS.batch_size, "rollouts per PPO step")
    mini_batch_size: int = argument(DEFAULTS.mini_batch_size, "rollouts per PPO minibatch")
    gradient_accumulation_steps: int = argument(DEFAULTS.gradient_accumulation_steps, "minibatches per optimizer step")
    generation_batch_size: int = argument(DEFAULTS.generation_batch_size, "sequences per generate() call")
    prompt_length: int = argument(DEFAULTS.prompt_length, "prompt tokens")
    response_length: int = argument(DEFAULTS.response_length, "response tokens")
    no_reward_model: bool = argument(False, "a reward function scores (no reward branch/model)")
    train_lm_head: bool = argument(False, "the LM head trains too")
    train_final_norm: bool = argument(False, "the final norm trains too")
    gradient_checkpointing: bool = argument(False, "recompute the trainable layers' activations in backward")
    entropy: bool = argument(False, "an entropy bonus in the update (ppo.ent_coef != 0)")
    sampler: str = argument(DEFAULTS.sampler, "graph: its static KV cache is held all step", choices=SAMPLERS)
    # What to print instead of the plan's table.
    json: bool = argument(False, "print the plan as JSON")
    gpu: float | None = argument(
        None, "GiB of a GPU: which settings fit it, beside TRL's GRPO + LoRA and the classic layout"
    )
    largest: bool = argument(
        False,
        "peak of every preset and the largest that fits each GPU size, full top-N and LoRA (rank --lora-rank, "
        "default 16)",
    )
    validate: bool = argument(
        False,
        "measure two PPO steps on this CPU (float32) of a 135M and a 410M model against the plan (minutes; "
        "`python -m hydrappo.planner.validate --help` for its options)",
    )


def memory_parser() -> argparse.ArgumentParser:
    return command_parser(
        MemoryOptions,
        PROG,
        "Plan the GPU memory of PPO-RLHF with hydrappo (one trunk) and with the classic four-model "
        "layout, per component, and list the GPU sizes it fits.",
        dashes=True,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"presets: {', '.join(PRESETS)}\n\n" + "\n".join(planner.__doc__.split("\n\n")[1:2]),
    )


# ---------------------------------------------------------------------------- running it


def settings_from(args: MemoryOptions) -> TrainingSettings:
    """The planner's settings from the parsed options (ValueError when they do not make sense)."""
    unfrozen = DEFAULTS.num_layers_unfrozen if args.num_layers_unfrozen is None else args.num_layers_unfrozen
    return TrainingSettings(
        num_layers_unfrozen=unfrozen,
        trainable_layers=args.trainable_layers,
        lora_rank=args.lora_rank,
        dtype=args.dtype,
        optimizer=args.optimizer,
        master_weights={"auto": None, "yes": True, "no": False}[args.master_weights],
        trunk_quantization=args.trunk_quantization,
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
        sampler=args.sampler,
    )


def run_validation() -> int:
    """`--validate`: planner/validate.py with its defaults (each measured run trains in a child process)."""
    from .validate import main

    return main([])


def plan_text(args: MemoryOptions, settings: TrainingSettings) -> str:
    """The plan of args.model as a table, as JSON, or as the settings that fit --gpu."""
    config = load_model_config(args.model)
    plan = planner.plan_memory(config, settings, args.model)
    if args.json:
        return json.dumps(planner.plan_to_dict(plan), indent=2)
    if args.gpu:
        return fit.format_fits(config, settings, args.model, args.gpu)
    return planner.format_plan(plan)


def memory_command(argv: list[str]) -> int:
    """`hydrappo memory MODEL | --largest | --validate [options]`."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = memory_parser()
    args = options_from(MemoryOptions, parser.parse_args(argv), dashes=True)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    if args.validate:
        return run_validation()
    try:
        settings = settings_from(args)
        if args.largest:
            print(planner.format_largest(settings, args.lora_rank or 16))
            return 0
        if not args.model:
            parser.print_help()
            return 2
        text = plan_text(args, settings)
    except (ValueError, OSError) as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return 2
    print(text)
    return 0
