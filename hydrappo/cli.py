"""The `hydrappo` command.

    hydrappo train CONFIG.yaml [--resume [PATH]] [--option value ...]

Options after the config file override it (`--learning_rate 3e-6`); run
`hydrappo train CONFIG.yaml --help` to list them all.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from .config import ConfigError, parse_config


def _train(args, overrides: list[str]) -> int:
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


COMMANDS = {"train": (_train, "run PPO from a YAML config")}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hydrappo", description="PPO for RLHF on one transformer trunk.")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help=COMMANDS["train"][1], add_help=False)
    train.add_argument("config", help="YAML config (see examples/)")
    train.add_argument(
        "--resume", nargs="?", const="latest", default=None,
        help="continue from the latest checkpoint in train.output_dir, or from PATH",
    )
    return parser


def _print_train_help(parser) -> None:
    """`hydrappo train --help`: the command's own arguments, then every config option."""
    from transformers import HfArgumentParser

    from .config import SECTIONS

    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    print(subparsers.choices["train"].format_help())
    print("Config options (YAML keys under their section, or --name value on the command line):")
    HfArgumentParser(tuple(SECTIONS.values())).print_help()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if argv and argv[0] == "train" and any(a in ("-h", "--help") for a in argv[1:]):
        _print_train_help(parser)
        return 0
    args, overrides = parser.parse_known_args(argv)
    try:
        return COMMANDS[args.command][0](args, overrides)
    except ConfigError as error:
        print(f"hydrappo {args.command}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
