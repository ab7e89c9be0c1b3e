"""Export a hydrappo checkpoint's trained policy as a plain transformers model directory.

The result (config.json, tokenizer, safetensors weights, sharded with --max-shard-size)
loads with `AutoModelForCausalLM.from_pretrained(DIR)` alone: no hydrappo, no peft. The
base model is rebuilt from the checkpoint's config.yaml as training built it, the trained
weights are loaded (LoRA adapters merged), and the policy is saved with save_pretrained.

    python tools/convert_checkpoint.py outputs/run/checkpoint-100 --out models/policy
    python tools/convert_checkpoint.py outputs/run --out models/policy --value-head models/value_head.safetensors
    python tools/convert_checkpoint.py CKPT --out DIR --base-model path/to/base --max-shard-size 2GB

The same as `hydrappo export CHECKPOINT ...`. Other conversions: tools/convert_trlx.py
(trlX hydra checkpoint -> hydrappo checkpoint) and tools/convert_gguf.py (GGUF ->
safetensors, also `hydrappo export gguf`). Exit code 2 on bad input (missing checkpoint
or base model, weights that do not fit, non-empty --out without --overwrite).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    from hydrappo.cli import main as hydrappo

    return hydrappo(['export', 'checkpoint', *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
