"""Merge a LoRA checkpoint's adapter into its base model and write a plain transformers
model directory (config, tokenizer, safetensors weights) that loads with
`AutoModelForCausalLM.from_pretrained` and no peft.

    python tools/merge_lora.py outputs/run/checkpoint-100 --out merged-model
    python tools/merge_lora.py CHECKPOINT --out DIR --base-model PATH --overwrite

A run started from a trained adapter (lora.lora_init_adapter) is merged on top of that
adapter too, so the result is exactly the trained policy.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a hydrappo checkpoint folder of a LoRA run (checkpoint-<step>)")
    parser.add_argument("--out", required=True, help="output model directory")
    parser.add_argument("--base-model", help="base model location, if it moved since training")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty output directory")
    parser.add_argument("--max-shard-size", default="5GB", help="shard size of the written weights")
    args = parser.parse_args(argv)

    from hydrappo.checkpoint import CheckpointError, load_trainable_weights, resolve_checkpoint
    from hydrappo.evaluate import load_checkpoint_config
    from hydrappo.lora import merged_model
    from hydrappo.models import build_hydra
    from hydrappo.trainer import seed_everything

    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not args.overwrite:
        print(f"merge_lora: {out} is not empty; pass --overwrite to replace it.", file=sys.stderr)
        return 2
    try:
        checkpoint = resolve_checkpoint(args.checkpoint, Path(args.checkpoint).parent)
        config = load_checkpoint_config(checkpoint)
        if config.lora.lora_r <= 0:
            print(f"merge_lora: {checkpoint} is not a LoRA run (lora_r = 0); use tools/convert_checkpoint.py.", file=sys.stderr)
            return 2
        if args.base_model:
            config.model.name_or_path = args.base_model
        seed_everything(config.train.seed)
        hydra, tokenizer = build_hydra(config.model, config.lora, device=torch.device("cpu"))
        load_trainable_weights(hydra, checkpoint)
    except (CheckpointError, ValueError, FileNotFoundError) as error:
        print(f"merge_lora: {error}", file=sys.stderr)
        return 2
    model = merged_model(hydra)
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(out, max_shard_size=args.max_shard_size)
    tokenizer.save_pretrained(out)
    print(f"wrote the merged policy of {checkpoint} to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
