"""The agent example's task: add two numbers too large to add in one's head, with a calculator.

A question "What is 48213 + 97361?" (two 5-digit numbers); the policy may call the `add` tool
(`<tool_call>{"name": "add", "arguments": {"a": 48213, "b": 97361}}</tool_call>`), reads the
result in a tool turn, and answers. Rewards (TRL's convention, reward.py): accuracy, 1 when the
final answer's last number is the sum.

    python examples/agent/task.py      # writes train_prompts.jsonl, eval_prompts.jsonl and sft.jsonl here

sft.jsonl holds prompt/response rows for the SFT stage (sft.yaml): SmolLM2-135M-Instruct writes no
valid tool call on its own (README).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent


def add(a: int, b: int) -> int:
    """Add two whole numbers exactly.

    Args:
        a: The first number.
        b: The second number.
    """
    return int(a) + int(b)


def question(rng: random.Random) -> dict:
    a, b = rng.randint(10_000, 99_999), rng.randint(10_000, 99_999)
    return {"prompt": f"What is {a} + {b}?", "answer": str(a + b), "a": a, "b": b}


def transcript(row: dict) -> list[dict]:
    """The conversation the policy should have: one call, the tool's result, the answer."""
    call = json.dumps({"name": "add", "arguments": {"a": row["a"], "b": row["b"]}})
    return [
        {"role": "user", "content": row["prompt"]},
        {"role": "assistant", "content": f"<tool_call>\n{call}\n</tool_call>"},
        {"role": "tool", "content": row["answer"]},
        {"role": "assistant", "content": f"{row['a']} + {row['b']} = {row['answer']}"},
    ]


def sft_rows(rows: list[dict], tokenizer) -> list[dict]:
    """Prompt/response rows for `hydrappo sft`, one per assistant turn of each transcript: the
    prompt is the conversation so far as the policy sees it in training (the chat template, the
    tool description in the system turn, the tool turn), the response that turn's text. So the
    loss falls on the policy's own turns only, never on the tool's result."""
    from hydrappo.agent import calls, toolbox

    schemas = [toolbox.tool_of(add).schema]
    out = []
    for row in rows:
        turns = transcript(row)
        for end in (1, 3):  # before each assistant turn
            messages = calls.episode_messages(turns[:end], schemas, None, None, template_renders_tools=False)
            prompt = tokenizer.decode(calls.prompt_ids(tokenizer, messages, schemas, False))
            out.append({"prompt": prompt, "response": turns[end]["content"]})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", type=int, default=512)
    parser.add_argument("--held-out", type=int, default=20)
    parser.add_argument("--sft", type=int, default=200, help="synthetic tool-call transcripts for the SFT stage")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    rows, seen = [], set()
    while len(rows) < args.train + args.held_out + args.sft:
        row = question(rng)
        if row["prompt"] not in seen:  # held-out questions are never trained on
            seen.add(row["prompt"])
            rows.append(row)
    held_out, train, sft = rows[: args.held_out], rows[args.held_out : args.held_out + args.train], rows[-args.sft :]
    for name, part in (("train_prompts.jsonl", train), ("eval_prompts.jsonl", held_out)):
        (args.out / name).write_text(
            "".join(json.dumps({"prompt": r["prompt"], "answer": r["answer"]}) + "\n" for r in part)
        )
    from hydrappo.storage.models import load_tokenizer

    tokenizer = load_tokenizer("smollm2-135m-instruct")
    (args.out / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sft_rows(sft, tokenizer)))
    print(
        f"wrote {len(train)} training, {len(held_out)} held-out questions and {len(sft)} SFT transcripts to {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
