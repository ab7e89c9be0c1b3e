"""A hydrappo run's checkpoint -> a plain transformers model folder (LoRA merged), or with --keep-adapter a
LoRA run's adapter as a peft adapter folder: the same conversion as `hydrappo export CHECKPOINT --out DIR`
(hydrappo/storage/export_command.py run_export, over storage/export.py export_checkpoint), as a script.

    python tools/export_checkpoint.py outputs/run --out models/policy               # the newest checkpoint
    python tools/export_checkpoint.py outputs/run/checkpoint-100 --out models/policy --dtype bfloat16
    python tools/export_checkpoint.py outputs/lora-run --out models/adapter --keep-adapter

The folder loads with AutoModelForCausalLM.from_pretrained alone; the adapter folder (adapter_config.json,
adapter_model.safetensors, the tokenizer) with PeftModel.from_pretrained(base_model, folder). A checkpoint
without LoRA is refused with --keep-adapter. An --out ending in .gguf is tools/export_gguf.py's export.
An existing --out is kept unless --overwrite (then moved to a sibling NAME.previous-<time>, never deleted).
"""

from __future__ import annotations

import argparse
import os
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="A hydrappo checkpoint -> a transformers model folder (LoRA merged), or its LoRA adapter "
        "as a peft adapter folder (--keep-adapter).",
        epilog="The same export as `hydrappo export CHECKPOINT --out DIR` (hydrappo export --help).",
    )
    parser.add_argument("checkpoint", help="a checkpoint-<step> folder, or a run's output_dir (its newest)")
    parser.add_argument("--out", required=True, help="the model folder to write (new or empty)")
    parser.add_argument(
        "--keep-adapter",
        action="store_true",
        help="a LoRA run: write the adapter unmerged, a folder PeftModel.from_pretrained(base, DIR) loads",
    )
    parser.add_argument("--base-model", help="the checkpoint's base model, if it moved since training")
    parser.add_argument("--tokenizer", help="the checkpoint's tokenizer, if it moved since training")
    parser.add_argument("--dtype", help="dtype of the written weights, e.g. bfloat16 (default: training's)")
    parser.add_argument("--max-shard-size", default="5GB", help="largest safetensors shard, e.g. 2GB (default 5GB)")
    parser.add_argument("--value-head", help="also write the value head to this .safetensors file")
    parser.add_argument("--reward-branch", help="also write the run's reward branch to this .safetensors file")
    parser.add_argument("--device", default="cpu", help="where the model is rebuilt (default cpu)")
    parser.add_argument(
        "--overwrite", action="store_true", help="move an existing --out to NAME.previous-<time> and write"
    )
    parser.set_defaults(gguf_type=None)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from hydrappo.errors import HydrappoError
    from hydrappo.storage.export_command import run_export

    try:
        run_export("checkpoint", args)
    except HydrappoError as error:
        print(f"export_checkpoint.py: {error}", file=sys.stderr)
        return error.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
