"""Convert a trlX hydra checkpoint to a hydrappo checkpoint, to keep training with hydrappo.

trlX's AutoModelForCausalLMWithHydraValueHead saves `base_model.*` (the trained causal
LM), `v_head.*` (an MLP h -> 2h -> 1, hydrappo's value head shape) and `frozen_head.*`
(the original top N layers, final norm and lm_head: the reference). The output is a
hydrappo checkpoint directory (trainable.safetensors with the trained top layers and the
value head under hydrappo's names, config.yaml, trainer_state.json) plus, with
--write-base, the base model it sits on: trlX's trunk (whose embeddings trlX trains too)
with the ORIGINAL top layers, so that hydrappo's reference is trlX's reference.

    python tools/convert_trlx.py trlx_ckpt/ --out converted/checkpoint-0 --write-base converted/base
    python tools/convert_trlx.py trlx_ckpt/pytorch_model.bin --config base/ --out CKPT --base-model base/

Weights are read with torch.load(weights_only=True) or safetensors; sharded checkpoints
are read through their index. The same as `hydrappo export trlx ...`. Exit code 2 on
bad input.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    from hydrappo.cli import main as hydrappo

    return hydrappo(['export', 'trlx', *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
