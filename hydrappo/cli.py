"""The `hydrappo` command: every sub-command's arguments, turned into a call. Nothing imports
this module (the layering test checks it); `python -m hydrappo` and the `hydrappo` script
start here.

    hydrappo train CONFIG.yaml [--resume [PATH]] [--option value ...]      PPO
    hydrappo reward CONFIG.yaml [--resume [PATH]] [--option value ...]     a reward branch
    hydrappo sft CONFIG.yaml [--resume [PATH]] [--option value ...]        supervised fine-tuning
    hydrappo generate CHECKPOINT --prompts FILE                            base vs trained, scored
    hydrappo compare A B ... --prompts FILE                                several models, scored
    hydrappo export CHECKPOINT --out DIR | export trlx ... | export gguf ...
    hydrappo memory MODEL | --largest | --validate                        the GPU memory planner

An error hydrappo raises on purpose (hydrappo.errors.HydrappoError) is printed as its
message alone, with exit code 2 for a usage error and 1 for a failure while running; an
operating-system error (a full disk, a permission) is printed the same way with exit code 1,
and anything else as one line that says it is unexpected. `--debug` anywhere on the command
line, or HYDRAPPO_DEBUG=1, prints the traceback too. Training stopped by SIGINT or SIGTERM
exits with 130 or 143 (train/interrupt.py).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import subprocess
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import console, usercode
from .errors import HydrappoError, describe_os_error, on_the_command_line

# ---------------------------------------------------------------------------- train, reward, sft
# Under torchrun / accelerate launch every process runs the command (train/distributed.py);
# process 0 reports, and each process that fails prints its own error.


def _process() -> tuple[int, int]:
    """(RANK, WORLD_SIZE) a launcher set; (0, 1) without one."""
    return int(os.environ.get("RANK", "0") or 0), int(os.environ.get("WORLD_SIZE", "1") or 1)


def _report(text: str) -> None:
    if _process()[0] == 0:
        print(text)


def _config_command(argv: list[str], prog: str, description: str, config_cls):
    """The front of every command that takes CONFIG.yaml, `--resume [PATH]` and `--option value`
    overrides. Returns the parsed config, the checkpoint to resume from and the stage's inputs
    (train/inputs.py), or an exit code after the help."""
    from .config import config_parser, parse_config

    parser = usercode.CommandParser(prog=prog, description=description, add_help=False)
    parser.add_argument("config", nargs="?", help="YAML config (see examples/)")
    parser.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        default=None,
        help="continue from the latest checkpoint in train.output_dir, or from PATH",
    )
    parser.add_argument("-h", "--help", action="store_true")
    args, overrides = parser.parse_known_args(argv)
    if args.help or args.config is None:
        print(parser.format_help())
        print("Config options (YAML keys under their section, or --name value on the command line):")
        config_parser(config_cls).print_help()
        return 0 if args.help else 2
    config = parse_config(args.config, overrides, config_cls)
    from .storage.models import fetch_hub_models
    from .storage.rundir import start_run  # before any model loads: output_dir claimed, --resume's checkpoint
    from .train.inputs import read_inputs

    # Before anything is written: the data and reward functions, checked (train/inputs.py), and
    # every Hub id, cached or downloaded.
    stage_inputs = read_inputs(config)
    fetch_hub_models(config)
    resume = start_run(config, args.resume, writer=_process()[0] == 0)
    return config, resume, stage_inputs


def _trainer(stage: str):
    if stage == "ppo":
        from .train.ppo import PPOTrainer

        return PPOTrainer
    if stage == "reward":
        from .train.reward_model import RewardTrainer

        return RewardTrainer
    from .train.sft import SFTTrainer

    return SFTTrainer


@dataclass(frozen=True)
class Stage:
    """A training command: CONFIG.yaml + overrides -> a trainer (train/stage.TrainingStage) -> its summary."""

    description: str
    config: str  # the config class, in hydrappo.config
    trainer: Callable  # () -> the trainer class (imported on use: `hydrappo --help` stays quick)
    summary: str  # its line in `hydrappo --help`


STAGES = {
    "train": Stage(
        "Run PPO. Options after the config file override it, e.g. --learning_rate 3e-6.",
        "Config",
        lambda: _trainer("ppo"),
        "PPO from a YAML config",
    ),
    "reward": Stage(
        "Train a reward branch on preference pairs (prompt, chosen, rejected). Options after the config "
        "file override it, e.g. --learning_rate 1e-4.",
        "RewardConfig",
        lambda: _trainer("reward"),
        "train a reward branch on preference pairs",
    ),
    "sft": Stage(
        "Supervised fine-tuning of the top layers (or LoRA adapters) on prompt/response pairs; writes a model "
        "directory (or adapter) that a PPO config can start from. Options after the config file override it.",
        "SFTConfig",
        lambda: _trainer("sft"),
        "supervised fine-tuning of the top layers; writes a model directory",
    ),
}


def stage_command(name: str, argv: list[str]) -> int:
    """`hydrappo train | reward | sft CONFIG.yaml [--resume [PATH]] [--option value ...]`."""
    from . import config as configs

    stage = STAGES[name]
    parsed = _config_command(argv, f"hydrappo {name}", stage.description, getattr(configs, stage.config))
    if isinstance(parsed, int):
        return parsed
    config, resume, inputs = parsed
    trainer = stage.trainer()(config, inputs=inputs)
    history = trainer.train(resume=resume)
    if not history:
        more = trainer.more_steps_option
        _report(
            f"nothing to do: the run is already at step {trainer.step} and {more} is {trainer.total_steps}; "
            f"raise {more} to train it further."
        )
        return 0
    _report(trainer.summary(history))
    return 0


# ---------------------------------------------------------------------------- generate, compare
TRUST_HELP = (
    "score with the reward function named in the checkpoint's config.yaml. That is running code that came with "
    "the checkpoint: only for checkpoints you trust (otherwise name the function yourself with --reward_fn)"
)


OVERWRITE_HELP = "replace an existing --output file: it is moved to a sibling NAME.previous-<time>, never deleted"


def generate_command(argv: list[str]) -> int:
    from .evaluate import add_reward_options, check_arguments, generate, side_by_side_text, write_comparison

    parser = usercode.CommandParser(
        prog="hydrappo generate",
        description="Generate with a checkpoint's policy (and its base model) for a prompts file, score the responses "
        "and print them side by side with the mean score of each.",
    )
    parser.add_argument(
        "checkpoint", help="a checkpoint folder (output_dir/checkpoint-<step>) or an output_dir (newest)"
    )
    parser.add_argument("--prompts", help="prompts file (default: the training prompts)")
    parser.add_argument("--prompt_column", default=None)
    add_reward_options(parser)
    parser.add_argument("--limit", type=int, default=None, help="use only the first N prompts")
    parser.add_argument("--max_new_tokens", type=int, default=None)
    parser.add_argument("--temperature", type=float, default=None)
    parser.add_argument("--no_base", action="store_true", help="skip the base model's responses")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", help="also write the comparison to FILE (.md table, .html or .jsonl rows)")
    parser.add_argument(
        "--overwrite", "--overwrite_output_dir", dest="overwrite", action="store_true", help=OVERWRITE_HELP
    )
    parser.add_argument("--trust_checkpoint_code", action="store_true", help=TRUST_HELP)
    args = parser.parse_args(argv)
    check_arguments(
        output=args.output,
        inputs={"the checkpoint": args.checkpoint, "--prompts": args.prompts},
        overwrite=args.overwrite,
    )
    columns = generate(
        args.checkpoint,
        args.prompts,
        args.prompt_column,
        args.reward_fn,
        args.limit,
        args.max_new_tokens,
        args.temperature,
        args.no_base,
        args.seed,
        trust_checkpoint_code=args.trust_checkpoint_code,
        reward_weights=args.reward_weights,
    )
    return _show(columns, args.output, side_by_side_text, functools.partial(write_comparison, overwrite=args.overwrite))


def compare_command(argv: list[str]) -> int:
    from .evaluate import add_reward_options, check_arguments, compare, side_by_side_text, write_comparison

    parser = usercode.CommandParser(
        prog="hydrappo compare",
        description="Several models (base, SFT, PPO checkpoints, exported directories) on the same prompts, with "
        "the same sampling seed: responses and reward scores side by side, and the mean score of each.",
    )
    parser.add_argument(
        "models", nargs="+", help="checkpoint or run folders, model directories or Hub ids, optionally NAME=PATH"
    )
    parser.add_argument("--prompts", required=True, help="prompts file (jsonl/csv/parquet/txt)")
    parser.add_argument("--prompt_column", default="prompt")
    add_reward_options(parser)
    parser.add_argument(
        "--chat_template",
        choices=["auto", "yes", "no"],
        default="auto",
        help="wrap prompts with each model's chat template (auto: as the first checkpoint was trained)",
    )
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--max_new_tokens", type=int, default=None)
    parser.add_argument("--temperature", type=float, default=None)
    parser.add_argument("--max_prompt_length", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", help="also write the table to FILE (.md, .html or .jsonl)")
    parser.add_argument(
        "--overwrite", "--overwrite_output_dir", dest="overwrite", action="store_true", help=OVERWRITE_HELP
    )
    parser.add_argument("--trust_checkpoint_code", action="store_true", help=TRUST_HELP)
    args = parser.parse_args(argv)
    check_arguments(
        output=args.output,
        inputs={"--prompts": args.prompts, **{m: m.rpartition("=")[2] for m in args.models}},
        overwrite=args.overwrite,
    )
    columns = compare(
        args.models,
        args.prompts,
        args.prompt_column,
        args.reward_fn,
        args.chat_template,
        args.limit,
        args.max_new_tokens,
        args.temperature,
        args.max_prompt_length,
        args.seed,
        trust_checkpoint_code=args.trust_checkpoint_code,
        reward_weights=args.reward_weights,
    )
    return _show(columns, args.output, side_by_side_text, functools.partial(write_comparison, overwrite=args.overwrite))


def _show(columns, output, as_text, write) -> int:
    print(as_text(columns))
    if output:
        write(columns, Path(output))
        print(f"wrote {output}")
    return 0


# ---------------------------------------------------------------------------- export


def _dtype_arg(text: str):
    from .config import ConfigError, torch_dtype

    try:
        return torch_dtype(text) if text != "auto" else None
    except ConfigError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


EXPORT_EPILOG = (
    "examples:\n  hydrappo export outputs/run/checkpoint-100 --out models/policy\n"
    "  hydrappo export outputs/run --out models/policy --value-head models/value_head.safetensors\n"
    "  hydrappo export CKPT --out DIR --base-model path/to/base --max-shard-size 2GB --dtype bfloat16\n\n"
    "other conversions: hydrappo export trlx --help, hydrappo export gguf --help"
)
TRLX_EPILOG = (
    "examples:\n  hydrappo export trlx trlx_ckpt/ --out converted/checkpoint-0 --write-base converted/base\n"
    "  hydrappo export trlx trlx_ckpt/pytorch_model.bin --config base/config.json --out CKPT --base-model base/\n\n"
    "The checkpoint holds the trained top layers and value head; --write-base writes the model it sits on (trlX's\n"
    "trained trunk with the original top layers, i.e. trlX's reference). Point model.name_or_path at it, with\n"
    "the num_layers_unfrozen / train_lm_head / train_final_norm printed here (also in the checkpoint's config.yaml),\n"
    "and load the weights with hydrappo.storage.checkpoint.load_trainable_weights(hydra, CKPT)."
)


def _export_parser(command: str, prog: str) -> argparse.ArgumentParser:
    raw = argparse.RawDescriptionHelpFormatter
    if command == "checkpoint":
        parser = usercode.CommandParser(
            prog=prog,
            epilog=EXPORT_EPILOG,
            formatter_class=raw,
            description=(
                "Write a hydrappo checkpoint's trained policy as a transformers model directory (config, tokenizer, "
                "safetensors) that loads with AutoModelForCausalLM.from_pretrained alone."
            ),
        )
        parser.add_argument(
            "checkpoint", help="a checkpoint folder (output_dir/checkpoint-<step>) or an output_dir (newest)"
        )
        parser.add_argument("--out", required=True, help="output model directory (must be empty or new)")
        parser.add_argument(
            "--base-model", help="base model location, overriding the checkpoint's config.yaml (if it moved)"
        )
        parser.add_argument("--tokenizer", help="tokenizer location, overriding the checkpoint's config.yaml")
        parser.add_argument(
            "--dtype", type=_dtype_arg, help="dtype of the written weights (default: the training dtype)"
        )
        parser.add_argument("--max-shard-size", default="5GB", help="largest safetensors shard, e.g. 2GB (default 5GB)")
        parser.add_argument("--value-head", help="also write the value head to this .safetensors file")
        parser.add_argument("--reward-branch", help="also write the run's reward branch to this .safetensors file")
        parser.add_argument("--device", default="cpu", help="where to rebuild the model (default cpu)")
    elif command == "trlx":
        parser = usercode.CommandParser(
            prog=prog,
            epilog=TRLX_EPILOG,
            formatter_class=raw,
            description=(
                "Convert a trlX hydra checkpoint (AutoModelForCausalLMWithHydraValueHead: base_model.*, v_head.*, "
                "frozen_head.*) to a hydrappo checkpoint, to keep training with hydrappo."
            ),
        )
        parser.add_argument(
            "source", help="trlX checkpoint: a directory (pytorch_model.bin, model.safetensors, shards) or a file"
        )
        parser.add_argument("--out", required=True, help="hydrappo checkpoint directory to write")
        parser.add_argument("--write-base", help="write the base model directory (config, tokenizer, safetensors) here")
        parser.add_argument("--base-model", help="the original model trlX started from (needed without a frozen head)")
        parser.add_argument("--config", help="the model's config.json or its directory (default: next to SOURCE)")
        parser.add_argument("--tokenizer", help="tokenizer directory (default: SOURCE's directory)")
        parser.add_argument("--num-layers-unfrozen", type=int, help="N, when the checkpoint has no frozen head to tell")
        parser.add_argument("--max-shard-size", default="5GB", help="largest safetensors shard of --write-base")
    else:
        from .storage.models import BUNDLED_MODELS

        parser = usercode.CommandParser(
            prog=prog,
            description="Dequantise a GGUF model to a float32 safetensors model directory (model + tokenizer).",
        )
        parser.add_argument(
            "source",
            help=f"a bundled name ({', '.join(BUNDLED_MODELS)}), a .gguf file, or a directory with --gguf-file",
        )
        parser.add_argument("--gguf-file", default=None, help="GGUF file inside the source directory")
        parser.add_argument("--out", required=True, help="output model directory (created)")
    parser.add_argument(
        "--overwrite_output_dir",
        "--overwrite",
        dest="overwrite",
        action="store_true",
        help="write over a non-empty --out (and existing files): what is there is moved to a sibling "
        "NAME.previous-<time>, never deleted",
    )
    return parser


def export_command(argv: list[str]) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    command = argv[0] if argv and argv[0] in ("checkpoint", "trlx", "gguf") else "checkpoint"
    argv = argv[1:] if argv and argv[0] == command else argv
    prog = "hydrappo export" if command == "checkpoint" else f"hydrappo export {command}"
    args = _export_parser(command, prog).parse_args(argv)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    from .storage.hub import hub_snapshot
    from .storage.models import is_hub_id
    from .storage.rundir import claim_output_path

    for option in ("base_model", "tokenizer"):  # a Hub id: cached or downloaded before anything is written
        if getattr(args, option, None) and is_hub_id(getattr(args, option)):
            hub_snapshot(getattr(args, option), option="--" + option.replace("_", "-"))
    if command == "checkpoint":
        from .config import is_device_name
        from .storage.checkpoint import find_checkpoint
        from .storage.export import ExportError, export_checkpoint, parse_shard_size

        checkpoint = find_checkpoint(args.checkpoint, for_resume=False)  # a damaged one is refused here
        parse_shard_size(args.max_shard_size)
        if not is_device_name(args.device) or args.device == "auto":
            raise ExportError(f"--device={args.device!r} is not a device; use cpu, cuda or cuda:N.")
        inputs = {"the checkpoint": checkpoint, "--base-model": args.base_model, "--tokenizer": args.tokenizer}
        claim_output_path(args.out, overwrite=args.overwrite, option="--out", inputs=inputs)
        for option, path in (("--value-head", args.value_head), ("--reward-branch", args.reward_branch)):
            claim_output_path(path, overwrite=args.overwrite, option=option, folder=False, inputs=inputs)
        out = export_checkpoint(
            checkpoint,
            args.out,
            base_model=args.base_model,
            tokenizer=args.tokenizer,
            dtype=args.dtype,
            max_shard_size=args.max_shard_size,
            value_head=args.value_head,
            reward_branch=args.reward_branch,
            device=args.device,
        )
        print(f"wrote the trained policy of {checkpoint} to {out}")
        if args.value_head:
            print(f"wrote the value head to {args.value_head}")
    elif command == "trlx":
        from .storage.trlx import convert_trlx

        inputs = {"the trlX checkpoint": args.source, "--config": args.config, "--base-model": args.base_model}
        claim_output_path(args.out, overwrite=args.overwrite, option="--out", inputs=inputs)
        claim_output_path(args.write_base, overwrite=args.overwrite, option="--write-base", inputs=inputs)
        result = convert_trlx(
            args.source,
            args.out,
            config=args.config,
            write_base=args.write_base,
            base_model=args.base_model,
            num_layers_unfrozen=args.num_layers_unfrozen,
            tokenizer=args.tokenizer,
            max_shard_size=args.max_shard_size,
        )
        print(
            f"wrote hydrappo checkpoint {result.checkpoint} on base model {result.base_model}\n"
            f"  model.name_or_path: {result.base_model}\n  model.num_layers_unfrozen: {result.num_layers_unfrozen}\n"
            f"  model.train_lm_head: {str(result.train_lm_head).lower()}\n"
            f"  model.train_final_norm: {str(result.train_final_norm).lower()}"
        )
    else:
        from .storage.models import ModelLoadError, gguf_to_safetensors, resolve_model_source

        directory, gguf_file = resolve_model_source(args.source, args.gguf_file)
        if gguf_file is None:
            raise ModelLoadError(f"{args.source!r} is a model directory without a .gguf file: nothing to convert.")
        claim_output_path(args.out, overwrite=args.overwrite, option="--out", inputs={"the GGUF source": directory})
        out = gguf_to_safetensors(directory, gguf_file, args.out)
        print(f"converted {Path(directory) / gguf_file} -> {out}")
    return 0


# ---------------------------------------------------------------------------- memory


def memory_command(argv: list[str]) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    prog = "hydrappo memory"
    from .model.quantize import TRUNK_QUANTIZATIONS
    from .planner import fit, plan as planner
    from .planner.presets import PRESETS
    from .planner.settings import DTYPES, OPTIMIZERS, SAMPLERS, TrainingSettings

    d = TrainingSettings()
    parser = usercode.CommandParser(
        prog=prog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Plan the GPU memory of PPO-RLHF with hydrappo (one trunk) and with the classic four-model "
        "layout, per component, and list the GPU sizes it fits.",
        epilog=f"presets: {', '.join(PRESETS)}\n\n" + "\n".join(planner.__doc__.split("\n\n")[1:2]),
    )
    parser.add_argument("model", nargs="?", help="a preset name, a config.json or a model directory")
    layers = parser.add_mutually_exclusive_group()  # two ways to say which layers train
    layers.add_argument(
        "-N", "--num-layers-unfrozen", type=int, help=f"trainable top layers (-1: all; default {d.num_layers_unfrozen})"
    )
    layers.add_argument(
        "--trainable-layers",
        metavar="START:END",
        help="a band of trainable layers instead of the top N (0-based, END exclusive, e.g. 12:16)",
    )
    parser.add_argument(
        "--lora-rank", type=int, default=0, help="LoRA adapters of this rank on the top N layers (0: full training)"
    )
    parser.add_argument("--dtype", default=d.dtype, choices=sorted(DTYPES), help="weights dtype")
    parser.add_argument(
        "--master-weights",
        choices=("auto", "yes", "no"),
        default="auto",
        help="fp32 master copy + fp32 optimizer state of trainable weights (auto: when dtype is not fp32)",
    )
    parser.add_argument("--optimizer", default=d.optimizer, choices=OPTIMIZERS)
    parser.add_argument(
        "--trunk-quantization",
        default=d.trunk_quantization,
        choices=TRUNK_QUANTIZATIONS,
        help="the frozen bottom layers (and frozen untied input embeddings) in int8 / 4bit",
    )
    parser.add_argument("--batch-size", type=int, default=d.batch_size, help="rollouts per PPO step")
    parser.add_argument("--mini-batch-size", type=int, default=d.mini_batch_size)
    parser.add_argument("--gradient-accumulation-steps", type=int, default=d.gradient_accumulation_steps)
    parser.add_argument("--generation-batch-size", type=int, default=d.generation_batch_size)
    parser.add_argument("--prompt-length", type=int, default=d.prompt_length)
    parser.add_argument("--response-length", type=int, default=d.response_length)
    parser.add_argument(
        "--no-reward-model", action="store_true", help="a reward function scores (no reward branch/model)"
    )
    parser.add_argument("--train-lm-head", action="store_true")
    parser.add_argument("--train-final-norm", action="store_true")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--entropy", action="store_true", help="an entropy bonus in the update (ppo.ent_coef != 0)")
    parser.add_argument(
        "--sampler", default=d.sampler, choices=SAMPLERS, help="graph: its static KV cache is held all step"
    )
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
        "410M model against the plan (minutes; runs tools/validate_memory.py of a source checkout)",
    )
    args = parser.parse_args(argv)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    if args.validate:
        script = Path(__file__).resolve().parents[1] / "tools" / "validate_memory.py"
        if not script.is_file():
            print(
                f"{prog}: --validate runs tools/validate_memory.py of a hydrappo source checkout; this installation "
                "has none (clone the repository and run it there).",
                file=sys.stderr,
            )
            return 2
        return subprocess.run([sys.executable, str(script)]).returncode
    try:
        settings = TrainingSettings(
            num_layers_unfrozen=d.num_layers_unfrozen if args.num_layers_unfrozen is None else args.num_layers_unfrozen,
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
        if args.largest:
            print(planner.format_largest(settings, args.lora_rank or 16))
            return 0
        if not args.model:
            parser.print_help()
            return 2
        config = planner.load_model_config(args.model)
        plan = planner.plan_memory(config, settings, args.model)
    except (ValueError, OSError) as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return 2
    text = fit.format_fits(config, settings, args.model, args.gpu) if args.gpu else planner.format_plan(plan)
    print(json.dumps(planner.plan_to_dict(plan), indent=2) if args.json else text)
    return 0


# ---------------------------------------------------------------------------- the command table

COMMANDS = {
    **{name: (functools.partial(stage_command, name), stage.summary) for name, stage in STAGES.items()},
    "generate": (generate_command, "a checkpoint's and its base model's responses, scored, side by side"),
    "compare": (compare_command, "several models on the same prompts, scored side by side"),
    "export": (
        export_command,
        "checkpoint -> transformers model dir; `export trlx` / `export gguf` convert into hydrappo",
    ),
    "memory": (memory_command, "plan GPU memory per component, hydrappo vs the classic four models"),
}


def main(argv: list[str] | None = None) -> int:  # the program does not wait for threads user code left (usercode)
    usercode.COMMAND_LINE = True
    if argv is None:  # the program: a closed stdout or stderr (tee ended by Ctrl-C) must not stop training
        console.survive_lost_output()
    with on_the_command_line():  # messages name --options, not Python's arguments (errors.spell)
        code = _main(argv)
    return usercode.leave_threads_behind(code, end_process=argv is None)


def _main(argv: list[str] | None) -> int:
    rank, world_size = _process()
    # Under a launcher only process 0 tells what it is doing; every process warns.
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    # bitsandbytes (imported by peft when installed) warns on CPUs with AVX512-BF16 that an optional
    # kernel package is missing; hydrappo pins its quantized modules to the path that does not use it.
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("HYDRAPPO_DEBUG", "") not in ("", "0")
    argv = [arg for arg in argv if arg != "--debug"]
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        width = max(map(len, COMMANDS))
        lines = [f"  {name:<{width}}  {help_text}" for name, (_, help_text) in COMMANDS.items()]
        print("usage: hydrappo COMMAND [ARGS]\n\nRLHF on one transformer trunk.\n\ncommands:\n" + "\n".join(lines))
        if argv and argv[0] not in ("-h", "--help"):
            print(f"\nhydrappo: unknown command {argv[0]!r}", file=sys.stderr)
            return 2
        return 0 if argv else 2
    command = COMMANDS[argv[0]][0]
    prog = f"hydrappo {argv[0]}" + (f" (process {rank} of {world_size})" if world_size > 1 else "")
    code = 1
    try:
        code = command(argv[1:])
        return code
    except usercode.ParserExit as done:  # one of our parsers' (--help, a usage error it printed)
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 2)
    except SystemExit as done:  # anyone else's (user code a check did not wrap): an error
        last = traceback.extract_tb(done.__traceback__)[-1]
        return _fail(
            prog, f"sys.exit({done.code!r}) was called ({Path(last.filename).name}, line {last.lineno}).", 1, debug
        )
    except HydrappoError as error:  # raised on purpose, with a message that says what to fix: show just that
        return _fail(prog, str(error), error.exit_code, debug)
    except KeyboardInterrupt:
        return _fail(prog, "interrupted (Ctrl-C).", 130, debug)
    except Exception as error:  # a bug, or a case no check knows yet: one line, the traceback with --debug
        described = describe_os_error(error)
        if described is not None or isinstance(error, OSError):
            # The operating system refused something (a full disk, a permission): not a bug.
            reason, fix = described or (error.strerror.lower() if error.strerror else str(error), "check the path")
            paths = [os.fsdecode(p) for p in (getattr(error, "filename", None), getattr(error, "filename2", None)) if p]
            where = (
                f" at {' -> '.join(paths)}" if paths else ""
            )  # (a path given as bytes, e.g. by TensorBoard, as text)
            return _fail(
                prog,
                f"the operating system refused a file operation{where}: {reason}; {fix}. Files "
                "written completely before it are intact.",
                1,
                debug,
            )
        return _fail(
            prog,
            f"unexpected error: {type(error).__name__}: {error}. This is a bug (or a case hydrappo "
            "does not check yet): rerun with --debug for the traceback and report it.",
            1,
            debug,
        )
    finally:
        if "torch.distributed" in sys.modules:  # a command that ran under a launcher
            from .train.distributed import end_process_group

            end_process_group(succeeded=code == 0)


def _fail(prog: str, message: str, code: int, debug: bool) -> int:
    """Print an error as one line (every process of a launcher run prints its own); the traceback with --debug."""
    if debug:
        traceback.print_exc()
    elif code == 1 and "--debug" not in message:
        message += " (--debug shows the traceback)"
    print(f"{prog}: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
