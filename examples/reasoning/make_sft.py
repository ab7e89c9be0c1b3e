"""The reasoning example's SFT rows: the answer FORMAT only, taught on questions the RL stage never
asks. SmolLM2-135M-Instruct, started inside the <answer> tag, restates the problem ("3 - 0 = 3"),
which reasoning-gym's chain_sum scorer pays 1/9 of a point (README); 300 chain_sum items with two
TWO-digit terms, each answered "<answer>N</answer>", show it the form. The RL stage's questions
(config.yaml) have one-digit terms, so no training or held-out question of the RL stage is here.

    python examples/reasoning/make_sft.py        # writes sft.jsonl here
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=300)
    parser.add_argument("--out", type=Path, default=HERE / "sft.jsonl")
    args = parser.parse_args(argv)

    from hydrappo.prompts import format_prompt
    from hydrappo.storage.models import _load_tokenizer
    from hydrappo.tasks import ReasoningGymTask

    tokenizer = _load_tokenizer("smollm2-135m-instruct")
    task = ReasoningGymTask(
        "chain_sum",
        size=args.size,
        seed=1,
        answer_start="<answer>",
        min_terms=2,
        max_terms=2,
        min_digits=2,
        max_digits=2,
    )
    rows = [  # the prompt as the RL stage formats it (chat template, the assistant's turn opened with <answer>)
        {"prompt": format_prompt(row["prompt"], tokenizer, True), "response": f"{row['answer']}</answer>"}
        for row in task.train_dataset
    ]
    args.out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"wrote {len(rows)} SFT rows to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
