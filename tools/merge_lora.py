"""Merge a LoRA checkpoint's adapter into its base model and write a plain transformers
model directory (config, tokenizer, safetensors weights) that loads with
`AutoModelForCausalLM.from_pretrained` and no peft.

    python tools/merge_lora.py outputs/run/checkpoint-100 --out merged-model
    python tools/merge_lora.py CHECKPOINT --out DIR --base-model PATH --overwrite

A run started from a trained adapter (lora.lora_init_adapter) had that adapter merged
into its base, so the result is exactly the trained policy. This is `hydrappo export`
(tools/convert_checkpoint.py) restricted to LoRA runs; it takes the same options.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    from hydrappo.cli import main as hydrappo
    from hydrappo.config import Config
    from hydrappo.storage.checkpoint import find_checkpoint, load_checkpoint_config

    argv = list(sys.argv[1:] if argv is None else argv)
    source = next((a for a in argv if not a.startswith("-")), None)
    if source is not None and "-h" not in argv and "--help" not in argv:
        try:
            lora_r = load_checkpoint_config(find_checkpoint(source), Config).lora.lora_r
        except Exception:  # a bad checkpoint is reported by the export below, in its own words
            lora_r = None
        if lora_r == 0:
            print(f"merge_lora.py: {source} is not a LoRA run (lora_r = 0): use tools/convert_checkpoint.py.", file=sys.stderr)
            return 2
    return hydrappo(["export", "checkpoint", *argv])


if __name__ == "__main__":
    sys.exit(main())
