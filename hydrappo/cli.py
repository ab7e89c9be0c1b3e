"""The `hydrappo` command: a table of sub-commands, each implemented in its own module.

    hydrappo train CONFIG.yaml [--resume [PATH]] [--option value ...]

Every sub-command is `module:function`, called with the remaining arguments and
returning an exit code; `hydrappo COMMAND --help` describes each.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from pathlib import Path

from .config import ConfigError, parse_config

# name -> (implementation, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "sft": ("hydrappo.sft:sft_command", "supervised fine-tuning of the top layers; writes a model directory"),
    "reward": ("hydrappo.reward_trainer:reward_command", "train a reward branch on preference pairs"),
    "train": ("hydrappo.cli:train_command", "PPO from a YAML config"),
    "generate": ("hydrappo.evaluate:main", "a checkpoint's and its base model's responses, scored, side by side"),
    "compare": ("hydrappo.evaluate:compare_main", "several models on the same prompts, scored side by side"),
    "export": ("hydrappo.export:main", "checkpoint -> transformers model dir; `export trlx` / `export gguf` convert into hydrappo"),
    "memory": ("hydrappo.memory:main", "plan GPU memory per component, hydrappo vs the classic four models"),
}


def config_command_args(argv: list[str], prog: str, description: str, sections=None, add_arguments=None):
    """The front of every command that takes CONFIG.yaml plus `--option value` overrides.

    Returns (args, overrides), or an exit code after printing the help (which lists every
    config option of `sections`)."""
    parser = argparse.ArgumentParser(prog=prog, description=description, add_help=False)
    parser.add_argument("config", nargs="?", help="YAML config (see examples/)")
    if add_arguments is not None:
        add_arguments(parser)
    parser.add_argument("-h", "--help", action="store_true")
    args, overrides = parser.parse_known_args(argv)
    if args.help or args.config is None:
        print(parser.format_help())
        _print_config_options(sections)
        return 0 if args.help else 2
    return args, overrides


def train_command(argv: list[str]) -> int:
    def resume_option(parser):
        parser.add_argument(
            "--resume", nargs="?", const="latest", default=None,
            help="continue from the latest checkpoint in train.output_dir, or from PATH",
        )

    parsed = config_command_args(
        argv, "hydrappo train", "Run PPO. Options after the config file override it, e.g. --learning_rate 3e-6.",
        add_arguments=resume_option,
    )
    if isinstance(parsed, int):
        return parsed
    args, overrides = parsed

    from .checkpoint import CheckpointError
    from .trainer import PPOTrainer, TrainingError

    config = parse_config(args.config, overrides)
    trainer = PPOTrainer(config, config_dir=Path(args.config).resolve().parent)
    try:
        history = trainer.train(resume=args.resume)
    except (TrainingError, CheckpointError) as error:
        print(f"hydrappo train: {error}", file=sys.stderr)
        return 1
    if history:
        last = history[-1]
        print(
            f"done: step {last['step']}, reward {last['env/reward_mean']:.3f}, KL {last['objective/kl']:.3f}; "
            f"checkpoints, metrics.jsonl and TensorBoard logs in {config.train.output_dir}"
        )
    return 0


def _print_config_options(sections=None) -> None:
    from transformers import HfArgumentParser

    from .config import SECTIONS

    print("Config options (YAML keys under their section, or --name value on the command line):")
    HfArgumentParser(tuple((sections or SECTIONS).values())).print_help()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        width = max(map(len, COMMANDS))
        lines = [f"  {name:<{width}}  {help_text}" for name, (_, help_text) in COMMANDS.items()]
        print("usage: hydrappo COMMAND [ARGS]\n\nPPO for RLHF on one transformer trunk.\n\ncommands:\n" + "\n".join(lines))
        if argv and argv[0] not in ("-h", "--help"):
            print(f"\nhydrappo: unknown command {argv[0]!r}", file=sys.stderr)
            return 2
        return 0 if argv else 2
    module_name, function_name = COMMANDS[argv[0]][0].split(":")
    command = getattr(importlib.import_module(module_name), function_name)
    try:
        return command(argv[1:])
    except Exception as error:
        # Errors hydrappo raises on purpose carry a message that says what to fix: show
        # just that. Anything else is a bug, and its traceback is what a report needs.
        if not (isinstance(error, ConfigError) or type(error).__module__.startswith("hydrappo.")):
            raise
        print(f"hydrappo {argv[0]}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
