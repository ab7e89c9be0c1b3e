"""Compare several models on the same prompts: responses and reward scores side by side.

    python tools/compare.py base=outputs/sft-model ppo=outputs/run/checkpoint-45 \
        --prompts examples/sentiment/eval_prompts.jsonl --reward_fn examples/sentiment/reward.py:reward_fn \
        --output comparison.html

Each model is a hydrappo checkpoint folder (its trained policy is rebuilt) or a model
directory (e.g. an SFT output or an exported policy), optionally named NAME=PATH. Every
model samples with the same seed and settings (the first checkpoint's, or --max_new_tokens
/ --temperature). Prints a table to the terminal; --output writes .md, .html or .jsonl.
The same as `hydrappo compare`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    from hydrappo.cli import main as hydrappo

    return hydrappo(['compare', *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
