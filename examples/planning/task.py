"""The planning example's task: sums that need a calculator several times, and sums that need none.

"What is 48213 + 97361 + 20518 + 70044?" adds 3 to 5 numbers of 5 digits, too large for a 135M model
to add in its head. The policy has one tool, `add(a, b)`, which takes two numbers only, so a sum of k
numbers takes k - 1 calls, each adding the next number to the last result: the policy must plan a
chain of calls and carry each result into the next. "What is 3 + 5?" (two one-digit numbers) needs
no tool: the model adds it in its head, and a call there only costs. So an episode decides whether to
call, and how often. Rewards: reward.py.

    python examples/planning/task.py   # writes train_prompts.jsonl, eval_prompts.jsonl, sft.jsonl here

Columns of the prompt tables: prompt, answer (the sum), needs_tool (true for the 5-digit sums),
calls_needed (k - 1, or 0). sft.jsonl holds prompt/response rows for the SFT stage (sft.yaml), one
per assistant turn of a synthetic transcript, as examples/agent/task.py writes them.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOOL_SHARE = 0.7  # of the questions, the share that needs the tool


def add(a: int, b: int) -> int:
    """Add two whole numbers exactly.

    Args:
        a: The first number.
        b: The second number.
    """
    return int(a) + int(b)


def question(rng: random.Random) -> dict:
    """A sum of 3 to 5 numbers of 5 digits (70%), or of two one-digit numbers."""
    if rng.random() < TOOL_SHARE:
        numbers = [rng.randint(10_000, 99_999) for _ in range(rng.randint(3, 5))]
    else:
        numbers = [rng.randint(1, 9), rng.randint(1, 9)]
    needs_tool = numbers[0] >= 10_000
    return {
        "prompt": "What is " + " + ".join(map(str, numbers)) + "?",
        "answer": str(sum(numbers)),
        "needs_tool": needs_tool,
        "calls_needed": len(numbers) - 1 if needs_tool else 0,
        "numbers": numbers,
    }


def transcript(row: dict) -> list[dict]:
    """The conversation the policy should have: for a large sum, one call per number after the
    first, each on the last result, then the answer; for a small one, the answer at once. Each call
    turn first writes the plan that is left ("Left to add: 49755 + 72468."), and its call adds the
    first of those to the last result: the next number is then copied from the model's own last
    turn, one number shorter each time, instead of being found again in the question (the SFT model
    that had to find it re-added a number it had used, README)."""
    numbers = row["numbers"]
    turns = [{"role": "user", "content": row["prompt"]}]
    if not row["needs_tool"]:
        return turns + [{"role": "assistant", "content": f"{numbers[0]} + {numbers[1]} = {row['answer']}"}]
    total = numbers[0]
    for k, number in enumerate(numbers[1:], start=1):
        call = json.dumps({"name": "add", "arguments": {"a": total, "b": number}})
        left = " + ".join(map(str, numbers[k:]))
        total = add(total, number)
        turns += [
            {"role": "assistant", "content": f"Left to add: {left}.\n<tool_call>\n{call}\n</tool_call>"},
            {"role": "tool", "content": str(total)},
        ]
    return turns + [{"role": "assistant", "content": f"Nothing left to add. The sum is {row['answer']}."}]


def sft_rows(rows: list[dict], tokenizer) -> list[dict]:
    """Prompt/response rows for `hydrappo sft`, one per assistant turn: the prompt is the
    conversation so far as the policy sees it in an episode (the chat template, the tool's
    description in the system turn, the tool turns), the response that turn's text; so the loss
    falls on the policy's turns only, never on a tool's result."""
    from hydrappo.agent import calls, toolbox

    schemas = [toolbox.tool_of(add).schema]
    out = []
    for row in rows:
        turns = transcript(row)
        for end, turn in enumerate(turns):
            if turn["role"] == "assistant":
                messages = calls.episode_messages(turns[:end], schemas, None, None, template_renders_tools=False)
                prompt = tokenizer.decode(calls.prompt_ids(tokenizer, messages, schemas, False))
                out.append({"prompt": prompt, "response": turn["content"]})
    return out


def write_table(path: Path, rows: list[dict]) -> None:
    columns = ("prompt", "answer", "needs_tool", "calls_needed")
    path.write_text("".join(json.dumps({c: r[c] for c in columns}) + "\n" for r in rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", type=int, default=1024)
    parser.add_argument("--held-out", type=int, default=120, help="held-out questions (noise about +-0.09 at 0.5)")
    parser.add_argument("--sft", type=int, default=200, help="synthetic transcripts for the SFT stage")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    rows, seen = [], set()
    while len(rows) < args.held_out + args.train + args.sft:
        row = question(rng)
        # Held-out questions are never trained on; the small sums repeat (81 exist), so only the
        # held-out ones are kept apart from the rest.
        if row["prompt"] in seen:
            continue
        if len(rows) < args.held_out or row["needs_tool"]:
            seen.add(row["prompt"])
        rows.append(row)
    held_out, train, sft = rows[: args.held_out], rows[args.held_out : args.held_out + args.train], rows[-args.sft :]
    write_table(args.out / "train_prompts.jsonl", train)
    write_table(args.out / "eval_prompts.jsonl", held_out)
    from hydrappo.storage.models import _load_tokenizer

    tokenizer = _load_tokenizer("smollm2-135m-instruct")
    sft_table = sft_rows(sft, tokenizer)
    (args.out / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sft_table))
    needing = sum(r["needs_tool"] for r in held_out)
    print(
        f"wrote {len(train)} training and {len(held_out)} held-out questions ({needing} need the tool) and "
        f"{len(sft)} SFT transcripts ({len(sft_table)} assistant turns) to {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
