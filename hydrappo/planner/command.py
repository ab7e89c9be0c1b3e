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

from .. import usercode
from ..model.quantize import TRUNK_QUANTIZATIONS
from . import fit, plan as planner
from .counts import load_model_config
from .presets import PRESETS
from .settings import DTYPES, OPTIMIZERS, SAMPLERS, TrainingSettings

PROG = "hydrappo memory"
DEFAULTS = TrainingSettings()


# ---------------------------------------------------------------------------- the parser


def _add_layer_options(parser: argparse.ArgumentParser) -> None:
    """Which layers train and how: the top N or a band (two ways to say it, so exclusive), LoRA, precision."""
    layers = parser.add_mutually_exclusive_group()
    layers.add_argument(
        "-N",
        "--num-layers-unfrozen",
        type=int,
        help=f"trainable top layers (-1: all; default {DEFAULTS.num_layers_unfrozen})",
    )
    layers.add_argument(
        "--trainable-layers",
        metavar="START:END",
        help="a band of trainable layers instead of the top N (0-based, END exclusive, e.g. 12:16; or fractions of the depth, e.g. 0.43:0.57)",
    )
    parser.add_argument(
        "--lora-rank", type=int, default=0, help="LoRA adapters of this rank on the top N layers (0: full training)"
    )
    parser.add_argument("--dtype", default=DEFAULTS.dtype, choices=sorted(DTYPES), help="weights dtype")
    parser.add_argument(
        "--master-weights",
        choices=("auto", "yes", "no"),
        default="auto",
        help="fp32 master copy + fp32 optimizer state of trainable weights (auto: when dtype is not fp32)",
    )
    parser.add_argument("--optimizer", default=DEFAULTS.optimizer, choices=OPTIMIZERS)
    parser.add_argument(
        "--trunk-quantization",
        default=DEFAULTS.trunk_quantization,
        choices=TRUNK_QUANTIZATIONS,
        help="the frozen bottom layers (and frozen untied input embeddings) in int8 / 4bit",
    )


def _add_step_options(parser: argparse.ArgumentParser) -> None:
    """The shapes of one PPO step, and what runs in it."""
    parser.add_argument("--batch-size", type=int, default=DEFAULTS.batch_size, help="rollouts per PPO step")
    parser.add_argument("--mini-batch-size", type=int, default=DEFAULTS.mini_batch_size)
    parser.add_argument("--gradient-accumulation-steps", type=int, default=DEFAULTS.gradient_accumulation_steps)
    parser.add_argument("--generation-batch-size", type=int, default=DEFAULTS.generation_batch_size)
    parser.add_argument("--prompt-length", type=int, default=DEFAULTS.prompt_length)
    parser.add_argument("--response-length", type=int, default=DEFAULTS.response_length)
    parser.add_argument(
        "--no-reward-model", action="store_true", help="a reward function scores (no reward branch/model)"
    )
    parser.add_argument("--train-lm-head", action="store_true")
    parser.add_argument("--train-final-norm", action="store_true")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--entropy", action="store_true", help="an entropy bonus in the update (ppo.ent_coef != 0)")
    parser.add_argument(
        "--sampler", default=DEFAULTS.sampler, choices=SAMPLERS, help="graph: its static KV cache is held all step"
    )


def _add_output_options(parser: argparse.ArgumentParser) -> None:
    """What to print instead of the plan's table."""
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument(
        "--gpu", type=float, help="GiB of a GPU: which settings fit it, beside TRL's GRPO + LoRA and the classic layout"
    )
    parser.add_argument(
        "--largest",
        action="store_true",
        help="peak of every preset and the largest that fits each GPU size, full top-N and LoRA (rank --lora-rank, default 16)",
    )
    parser.add_argument(
        "--validate",
        action="store_true",
        help="measure two PPO steps on this CPU (float32) of a 135M and a "
        "410M model against the plan (minutes; `python -m hydrappo.planner.validate --help` for its options)",
    )


def memory_parser() -> argparse.ArgumentParser:
    parser = usercode.CommandParser(
        prog=PROG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Plan the GPU memory of PPO-RLHF with hydrappo (one trunk) and with the classic four-model "
        "layout, per component, and list the GPU sizes it fits.",
        epilog=f"presets: {', '.join(PRESETS)}\n\n" + "\n".join(planner.__doc__.split("\n\n")[1:2]),
    )
    parser.add_argument(
        "model",
        nargs="?",
        help="a preset name, a config.json, or a model as `hydrappo train` takes it (a model directory, a .gguf "
        "file, a bundled name, a cached Hub id)",
    )
    _add_layer_options(parser)
    _add_step_options(parser)
    _add_output_options(parser)
    return parser


# ---------------------------------------------------------------------------- running it


def settings_from(args: argparse.Namespace) -> TrainingSettings:
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


def plan_text(args: argparse.Namespace, settings: TrainingSettings) -> str:
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
    args = parser.parse_args(argv)
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
