"""The reasoning example's SFT rows: the answer FORMAT, taught on questions the RL stage never asks.
SmolLM2-135M-Instruct computes a one-digit sum by writing it out ("6 + 3 = 9"; right for most sums,
often wrong for differences below zero) but never puts its answer between <answer> tags, so the
task's verifier scores it 0 (README). 300 chain_sum items with two TWO-digit terms, each answered
with the sum written out and then its result in the tags ("42 - 25 = 17\n<answer>17</answer>"),
show it the form. The RL stage's questions (config.yaml) have one-digit terms, so no training or
held-out question of the RL stage is here.

    python examples/reasoning/make_sft.py        # writes sft.jsonl here
    python examples/reasoning/make_sft.py --model GEMMA.gguf --out sft_gemma.jsonl
                                                 # prompts as a run formats them for that model's tokenizer
                                                 # (plain text for a base model without a chat template)
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent


def worked_answer(row: dict) -> str:
    """The reply SFT shows: the problem restated with its result, then the result alone in the tags
    ("42 - 25 = 17\n<answer>17</answer>"): the model computes a sum by writing it out."""
    expression = re.search(r"problem: (.+?) =", row["prompt"]).group(1)  # chain_sum's question ends "... 42 - 25 ="
    return f"{expression} = {row['answer']}\n<answer>{row['answer']}</answer>"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=300)
    parser.add_argument("--out", type=Path, default=HERE / "sft.jsonl")
    parser.add_argument(
        "--model", default="smollm2-135m-instruct", help="the model whose tokenizer formats the prompts (as train does)"
    )
    args = parser.parse_args(argv)

    from hydrappo.config import parse_config
    from hydrappo.storage.models import load_tokenizer
    from hydrappo.tasks import ReasoningGymTask

    config = parse_config(HERE / "config.yaml", check=False)  # the RL stage's instruction and data section
    tokenizer = load_tokenizer(args.model)
    task = ReasoningGymTask(
        "chain_sum",
        size=args.size,
        seed=1,
        instruction=config.task.task_instruction,
        min_terms=2,
        max_terms=2,
        min_digits=2,
        max_digits=2,
    )
    prompts = task.prompt_set("train", tokenizer, config.data)  # as the RL stage formats them for this model
    rows = [
        {"prompt": prompt, "response": worked_answer(row)} for prompt, row in zip(prompts.formatted, task.train_dataset)
    ]
    args.out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"wrote {len(rows)} SFT rows to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
