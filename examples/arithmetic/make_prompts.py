"""Write the arithmetic example's prompt files: every sum "What is {a} + {b}?" with integers
a, b in [0, 20] (441 questions) and its `answer` column (a + b, which reward.py reads),
shuffled with a fixed seed and split into a training file and a disjoint held-out file that
training never sees.

    python examples/arithmetic/make_prompts.py          # writes train_prompts.jsonl, eval_prompts.jsonl here
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent


def questions() -> list[dict]:
    return [{"prompt": f"What is {a} + {b}?", "answer": str(a + b)} for a in range(21) for b in range(21)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--held-out", type=int, default=100, help="questions kept for evaluation (default 100)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=HERE, help="folder for the two files (default: this one)")
    args = parser.parse_args(argv)
    order = questions()
    random.Random(args.seed).shuffle(order)
    held_out, train = order[: args.held_out], order[args.held_out :]
    assert not {q["prompt"] for q in held_out} & {q["prompt"] for q in train}
    args.out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train_prompts.jsonl", train), ("eval_prompts.jsonl", held_out)):
        (args.out / name).write_text("".join(json.dumps(q) + "\n" for q in rows))
        print(f"wrote {len(rows)} questions to {args.out / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
