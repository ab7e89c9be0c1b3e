"""`hydrappo export`: the command line of the conversions storage/ does, beside them.

    hydrappo export CHECKPOINT --out DIR         a checkpoint's policy -> a transformers model (export.py);
                                                 --keep-adapter: a LoRA run's adapter as a peft adapter folder
    hydrappo export CHECKPOINT --out FILE.gguf   a checkpoint's policy (or a transformers folder) -> one GGUF
                                                 file for llama.cpp and Ollama, --gguf-type f16|q8_0|f32 (gguf_export.py)
    hydrappo export trlx SOURCE --out CKPT       a trlX hydra checkpoint -> a hydrappo checkpoint (trlx.py)
    hydrappo export to-trlx CHECKPOINT --out DIR a hydrappo checkpoint -> a trlX hydra checkpoint (trlx.py)
    hydrappo export from-gguf SOURCE --out DIR   a GGUF file -> a safetensors model folder (models.py);
                                                 `export gguf` is the same command, by its older name

Each conversion has its own parser and its own runner; `export_command` picks them by the first
argument (no sub-command name: a checkpoint export, to a folder or, for an --out ending in .gguf, to
one GGUF file); `run_export` runs one of parsed arguments, for this command and for the tools/ scripts
that are these conversions (tools/export_checkpoint.py, convert_trlx.py, gguf_to_safetensors.py). Every
output path is claimed before anything is written (rundir.claim_output_path: never over an input, never
over a run or an existing file without --overwrite).
"""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..config.command_line import argument, command_parser, options_from
from .gguf_export import GGUF_TYPES

CONVERSIONS = ("checkpoint", "trlx", "to-trlx", "gguf")
ALIASES = {"from-gguf": "gguf"}  # the reading direction, by a name that says it
FILE_SUFFIXES = (".gguf", ".safetensors", ".bin")  # an --out of the reading direction that names a file

EXPORT_EPILOG = (
    "examples:\n  hydrappo export outputs/run/checkpoint-100 --out models/policy\n"
    "  hydrappo export outputs/run --out models/policy --value-head models/value_head.safetensors\n"
    "  hydrappo export CKPT --out DIR --base-model path/to/base --max-shard-size 2GB --dtype bfloat16\n"
    "  hydrappo export outputs/run --out policy.gguf --gguf-type q8_0    one GGUF file for llama.cpp / Ollama\n"
    "  hydrappo export models/policy --out policy.gguf                  a transformers folder -> GGUF\n"
    "  hydrappo export outputs/lora-run --out models/adapter --keep-adapter   a LoRA run's peft adapter folder\n\n"
    "other conversions: hydrappo export trlx --help (trlX -> hydrappo), hydrappo export to-trlx --help\n"
    "(hydrappo -> trlX), hydrappo export from-gguf --help (GGUF file -> safetensors)"
)
TRLX_EPILOG = (
    "examples:\n  hydrappo export trlx trlx_ckpt/ --out converted/checkpoint-0 --write-base converted/base\n"
    "  hydrappo export trlx trlx_ckpt/pytorch_model.bin --config base/config.json --out CKPT --base-model base/\n\n"
    "The checkpoint holds the trained top layers and value head; --write-base writes the model it sits on (trlX's\n"
    "trained trunk with the original top layers, i.e. trlX's reference). Point model.name_or_path at it, with\n"
    "the num_layers_unfrozen / train_lm_head / train_final_norm printed here (also in the checkpoint's config.yaml),\n"
    "and load the weights with hydrappo.storage.checkpoint.load_trainable_weights(hydra, CKPT)."
)


def _dtype_arg(text: str):
    from ..config import ConfigError, torch_dtype

    try:
        return torch_dtype(text) if text != "auto" else None
    except ConfigError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _dtype_value(value):
    """--dtype as the runner takes it: a torch dtype or None; a tools/ script hands over the name it read."""
    from .export import ExportError

    if not isinstance(value, str):
        return value
    try:
        return _dtype_arg(value)
    except argparse.ArgumentTypeError as error:
        raise ExportError(f"--dtype: {error}") from None


# ---------------------------------------------------------------------------- the options of each conversion
# Spelt with dashes on the command line (--max-shard-size); each conversion's fields, then --overwrite.
CHECKPOINT_HELP = "a checkpoint folder (output_dir/checkpoint-<step>) or an output_dir (newest)"
TOKENIZER_HELP = "tokenizer location, overriding the checkpoint's config.yaml"
DEVICE_HELP = "where to rebuild the model (default cpu)"
OVERWRITE_HELP = (
    "write over a non-empty --out (and existing files): what is there is moved to a sibling "
    "NAME.previous-<time>, never deleted"
)


@dataclass
class CheckpointExport:
    checkpoint: str | None = argument(
        None, CHECKPOINT_HELP + "; with a .gguf --out, also a transformers model folder", positional=True
    )
    out: str | None = argument(
        None,
        "output model directory (must be empty or new), or a FILE.gguf: one GGUF file for llama.cpp and Ollama",
        required=True,
    )
    gguf_type: Literal[GGUF_TYPES] | None = argument(
        None, "with a .gguf --out: the type of the 2-D weights (default f16; q8_0 is 8-bit blocks; norms stay f32)"
    )
    base_model: str | None = argument(
        None, "base model location, overriding the checkpoint's config.yaml (if it moved)"
    )
    tokenizer: str | None = argument(None, TOKENIZER_HELP)
    dtype: str | None = argument(None, "dtype of the written weights (default: the training dtype)", type=_dtype_arg)
    max_shard_size: str = argument("5GB", "largest safetensors shard, e.g. 2GB (default 5GB)")
    value_head: str | None = argument(None, "also write the value head to this .safetensors file")
    reward_branch: str | None = argument(None, "also write the run's reward branch to this .safetensors file")
    keep_adapter: bool = argument(
        False,
        "a LoRA run: write its adapter unmerged, as a peft adapter folder (adapter_config.json, "
        "adapter_model.safetensors) that PeftModel.from_pretrained(base, DIR) loads on the base model",
    )
    device: str = argument("cpu", DEVICE_HELP)
    overwrite: bool = argument(False, OVERWRITE_HELP, names=("--overwrite_output_dir",))


@dataclass
class TrlxImport:
    source: str | None = argument(
        None,
        "trlX checkpoint: a directory (pytorch_model.bin, model.safetensors, shards) or a file",
        positional=True,
    )
    out: str | None = argument(None, "hydrappo checkpoint directory to write", required=True)
    write_base: str | None = argument(None, "write the base model directory (config, tokenizer, safetensors) here")
    base_model: str | None = argument(None, "the original model trlX started from (needed without a frozen head)")
    config: str | None = argument(None, "the model's config.json or its directory (default: next to SOURCE)")
    tokenizer: str | None = argument(None, "tokenizer directory (default: SOURCE's directory)")
    num_layers_unfrozen: int | None = argument(None, "N, when the checkpoint has no frozen head to tell")
    max_shard_size: str = argument("5GB", "largest safetensors shard of --write-base")
    overwrite: bool = argument(False, OVERWRITE_HELP, names=("--overwrite_output_dir",))


@dataclass
class TrlxExport:
    source: str | None = argument(None, CHECKPOINT_HELP, positional=True)
    out: str | None = argument(None, "the trlX checkpoint directory to write (must be empty or new)", required=True)
    base_model: str | None = argument(None, "base model location, overriding the checkpoint's config.yaml")
    tokenizer: str | None = argument(None, TOKENIZER_HELP)
    device: str = argument("cpu", DEVICE_HELP)
    overwrite: bool = argument(False, OVERWRITE_HELP, names=("--overwrite_output_dir",))


@dataclass
class GgufImport:
    source: str | None = argument(
        None, "a bundled name, a .gguf file, or a directory with --gguf-file", positional=True
    )
    gguf_file: str | None = argument(None, "GGUF file inside the source directory")
    out: str | None = argument(None, "output safetensors model directory (created), not a file", required=True)
    overwrite: bool = argument(False, OVERWRITE_HELP, names=("--overwrite_output_dir",))


def _gguf_description() -> str:
    from .models import BUNDLED_MODELS

    return (
        "GGUF file -> safetensors folder: dequantise a GGUF model to a float32 safetensors model "
        "directory (model + tokenizer) that transformers and hydrappo load. For the other direction (a "
        "checkpoint or a transformers folder -> a .gguf file) run `hydrappo export CHECKPOINT --out model.gguf`. "
        f"Bundled names: {', '.join(BUNDLED_MODELS)}."
    )


OPTIONS = {"checkpoint": CheckpointExport, "trlx": TrlxImport, "to-trlx": TrlxExport, "gguf": GgufImport}
DESCRIPTIONS = {
    "checkpoint": lambda: (
        "Write a hydrappo checkpoint's trained policy as a transformers model directory (config, tokenizer, "
        "safetensors) that loads with AutoModelForCausalLM.from_pretrained alone, or, when --out ends in "
        ".gguf, as one GGUF file that llama.cpp and Ollama run (Llama-style and Gemma 3 models; LoRA merged)."
    ),
    "trlx": lambda: (
        "Convert a trlX hydra checkpoint (AutoModelForCausalLMWithHydraValueHead: base_model.*, v_head.*, "
        "frozen_head.*) to a hydrappo checkpoint, to keep training with hydrappo."
    ),
    "to-trlx": lambda: (
        "Write a hydrappo checkpoint as a trlX hydra checkpoint folder (pytorch_model.bin with base_model.*, "
        "v_head.*, frozen_head.*; config.json; tokenizer) for AutoModelForCausalLMWithHydraValueHead."
        "from_pretrained(DIR, num_layers_unfrozen=N), N as printed. `hydrappo export trlx` reads it back."
    ),
    "gguf": _gguf_description,
}
EPILOGS = {"checkpoint": EXPORT_EPILOG, "trlx": TRLX_EPILOG}


def export_parser(conversion: str, prog: str) -> argparse.ArgumentParser:
    """The parser of one conversion, made from its options' dataclass (OPTIONS)."""
    return command_parser(
        OPTIONS[conversion],
        prog,
        DESCRIPTIONS[conversion](),
        dashes=True,
        epilog=EPILOGS.get(conversion),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


# ---------------------------------------------------------------------------- the runners


def _is_gguf_out(out: str) -> bool:
    return Path(out).suffix.lower() == ".gguf"


def export_checkpoint_command(args: argparse.Namespace) -> None:
    from ..config import is_device_name
    from .checkpoint import find_checkpoint
    from .export import ExportError, check_keep_adapter, export_checkpoint, parse_shard_size
    from .rundir import claim_output_path

    if not is_device_name(args.device) or args.device == "auto":
        raise ExportError(f"--device={args.device!r} is not a device; use cpu, cuda or cuda:N.")
    args.dtype = _dtype_value(args.dtype)
    if _is_gguf_out(args.out):
        if args.keep_adapter:
            raise ExportError(
                "--keep-adapter writes a peft adapter folder, not a GGUF file: give an --out folder, or leave it out."
            )
        export_gguf_file_command(args)
        return
    if args.gguf_type is not None:
        raise ExportError(
            f"--gguf-type {args.gguf_type} applies to a GGUF file: give an --out ending in .gguf, or leave it out."
        )
    if Path(args.checkpoint).suffix.lower() == ".gguf":
        raise ExportError(
            f"{args.checkpoint!r} is a GGUF file, not a checkpoint: `hydrappo export from-gguf {args.checkpoint} "
            "--out DIR` converts it to a safetensors folder."
        )
    checkpoint = find_checkpoint(args.checkpoint, for_resume=False)  # a damaged one is refused here
    parse_shard_size(args.max_shard_size)
    if args.keep_adapter:
        check_keep_adapter(checkpoint)  # before any output path is claimed
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
        keep_adapter=args.keep_adapter,
    )
    if args.keep_adapter:
        print(f"wrote the LoRA adapter of {checkpoint} to {out} (PeftModel.from_pretrained(base model, {out}))")
    else:
        print(f"wrote the trained policy of {checkpoint} to {out}")
    if args.value_head:
        print(f"wrote the value head to {args.value_head}")


def export_gguf_file_command(args: argparse.Namespace) -> None:
    """`hydrappo export SOURCE --out FILE.gguf`: a checkpoint's policy or a transformers folder as one GGUF file."""
    from .export import ExportError
    from .gguf_export import export_gguf

    if args.dtype is not None:
        raise ExportError("--dtype does not apply to a .gguf --out: --gguf-type f16|q8_0|f32 sets the weights' type.")
    result = export_gguf(
        args.checkpoint,
        args.out,
        args.gguf_type or "f16",
        overwrite=args.overwrite,
        base_model=args.base_model,
        tokenizer=args.tokenizer,
        device=args.device,
        value_head=args.value_head,
        reward_branch=args.reward_branch,
    )
    size = result.path.stat().st_size / 2**20
    print(
        f"wrote {result.path} ({result.gguf_type}, GGUF arch {result.arch}, {result.tensors} tensors, {size:.1f} MiB)"
        f" from {args.checkpoint}\n  llama.cpp: llama-cli -m {result.path} -p 'Hello'\n"
        f"  Ollama: a Modelfile with `FROM {result.path}`, then `ollama create NAME -f Modelfile`"
    )
    if args.value_head:
        print(f"wrote the value head to {args.value_head}")


def export_trlx_command(args: argparse.Namespace) -> None:
    from .rundir import claim_output_path
    from .trlx import convert_trlx

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


def export_to_trlx_command(args: argparse.Namespace) -> None:
    """`hydrappo export to-trlx CHECKPOINT --out DIR`: a hydrappo checkpoint -> a trlX hydra checkpoint."""
    from ..config import is_device_name
    from .checkpoint import find_checkpoint
    from .export import ExportError
    from .rundir import claim_output_path
    from .trlx import convert_to_trlx

    if not is_device_name(args.device) or args.device == "auto":
        raise ExportError(f"--device={args.device!r} is not a device; use cpu, cuda or cuda:N.")
    checkpoint = find_checkpoint(args.source, for_resume=False)
    inputs = {"the checkpoint": checkpoint, "--base-model": args.base_model, "--tokenizer": args.tokenizer}
    claim_output_path(args.out, overwrite=args.overwrite, option="--out", inputs=inputs)
    result = convert_to_trlx(
        checkpoint, args.out, base_model=args.base_model, tokenizer=args.tokenizer, device=args.device
    )
    head = " (the run had no value head: v_head is a new, untrained one)" if result.fresh_value_head else ""
    reference = (
        f"frozen_head holds the reference's top {result.num_layers_unfrozen} layers"
        if result.frozen_head
        else "no frozen_head: trlX's reference is then the base model, a model of its own"
    )
    print(
        f"wrote trlX hydra checkpoint {result.folder} from {checkpoint}{head}\n  {reference}\n"
        f"  trlX: AutoModelForCausalLMWithHydraValueHead.from_pretrained({str(result.folder)!r}, "
        f"num_layers_unfrozen={result.num_layers_unfrozen})"
    )


def export_gguf_command(args: argparse.Namespace) -> None:
    """`hydrappo export from-gguf SOURCE --out DIR`: GGUF file -> safetensors folder."""
    from .checkpoint import is_checkpoint_folder, latest_checkpoint
    from .models import ModelLoadError, gguf_to_safetensors, resolve_model_source
    from .rundir import claim_output_path

    writing = "to write a GGUF file, run `hydrappo export CHECKPOINT --out model.gguf`"
    if Path(args.out).suffix.lower() in FILE_SUFFIXES:
        raise ModelLoadError(
            f"--out {args.out}: `hydrappo export from-gguf` reads a GGUF file and writes a safetensors model folder, "
            f"so --out names a folder, not a {Path(args.out).suffix} file. For the other direction, {writing} "
            "(a checkpoint or a transformers folder -> one .gguf file)."
        )
    source = Path(args.source).expanduser()
    if source.is_dir() and (is_checkpoint_folder(source) or latest_checkpoint(source) is not None):
        raise ModelLoadError(
            f"{args.source!r} is a hydrappo checkpoint, not a GGUF file: `hydrappo export from-gguf` converts a GGUF "
            f"file to a safetensors folder. To write this checkpoint as GGUF, run `hydrappo export {args.source} "
            f"--out model.gguf`; as a transformers folder, `hydrappo export {args.source} --out DIR`."
        )
    directory, gguf_file = resolve_model_source(args.source, args.gguf_file)
    if gguf_file is None:
        raise ModelLoadError(
            f"{args.source!r} is a model directory without a .gguf file: nothing to convert from GGUF. To write it "
            f"as GGUF, run `hydrappo export {args.source} --out model.gguf`."
        )
    claim_output_path(
        args.out, overwrite=args.overwrite, option="--out", inputs={"the GGUF source": directory / gguf_file}
    )
    out = gguf_to_safetensors(directory, gguf_file, args.out)
    print(f"converted {Path(directory) / gguf_file} -> {out}")


def _fetch_hub_options(args: argparse.Namespace) -> None:
    """A Hub id given as --base-model or --tokenizer: cached or downloaded before anything is written."""
    from .hub import hub_snapshot
    from .models import is_hub_id

    for option in ("base_model", "tokenizer"):
        value = getattr(args, option, None)
        if value and is_hub_id(value):
            hub_snapshot(value, option="--" + option.replace("_", "-"))


RUNNERS = {
    "checkpoint": export_checkpoint_command,
    "trlx": export_trlx_command,
    "to-trlx": export_to_trlx_command,
    "gguf": export_gguf_command,
}


def run_export(conversion: str, args: argparse.Namespace) -> None:
    """One conversion of parsed arguments (the names its parser gives them), as `hydrappo export` runs it:
    what the tools/ conversion scripts call after reading their arguments."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    _fetch_hub_options(args)
    RUNNERS[conversion](args)


def export_command(argv: list[str]) -> int:
    """`hydrappo export [trlx | to-trlx | from-gguf] ...` (`gguf` is from-gguf's older name)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    named = argv[0] if argv and (argv[0] in CONVERSIONS or argv[0] in ALIASES) else None
    conversion = ALIASES.get(named, named) or "checkpoint"
    argv = argv[1:] if named else argv
    prog = "hydrappo export" if named is None else f"hydrappo export {named}"
    parsed = export_parser(conversion, prog).parse_args(argv)
    run_export(conversion, options_from(OPTIONS[conversion], parsed, dashes=True))
    return 0
