"""The planning example's task: sums that need a calculator several times, and sums that need none.

"Add these 4 numbers:" with the numbers listed one to a line ("1. 48213", "2. 97361", ...) adds 3
to 5 numbers of 5 digits, too large for a 135M model to add in its head. The policy has a
calculator, an environment (`Calculator`) with one tool, `add_line(line)`, which adds the number on
one line of the list to a running total and returns it with how far down the list it is ("Added
line 2 of 4. Total: 136766."): a sum of k numbers takes k calls, one per line in order, and the
answer is the last total. "Add these 2 numbers:" with two one-digit numbers needs no tool: the
model adds them in its head, and a call there only costs. So an episode decides whether to call,
and how often.
Rewards: reward.py.

    python examples/planning/task.py   # writes train_prompts.jsonl, eval_prompts.jsonl, sft.jsonl here

Columns of the prompt tables: prompt, answer (the sum), needs_tool (true for the 5-digit sums),
calls_needed (k, or 0), numbers (the list, which the calculator's reset takes). sft.jsonl holds
prompt/response rows for the SFT stage (sft.yaml), one per assistant turn of a synthetic
transcript, as examples/agent/task.py writes them. The transcripts come from two demonstrators, one
who adds with the calculator and one who adds in its head, both always right: most 5-digit sums are
added in the head (60%, --sft-in-head) and few one-digit sums with the calculator (5%,
--sft-small-with-tool). So the SFT model learns both ways, with a choice that leans a little on the
question, and not which way works for it: a 135M model cannot add 5-digit numbers in its head.
Making the choice follow the question is RL's part; with demonstrators that did not lean (30% of
the one-digit sums with the calculator), RL moved the choice on both kinds together (README). Half
the training questions are drawn as 5-digit sums (--train-tool-share; 60% after the held-out
one-digit sums are left out), against 70% of the held-out and SFT ones, so that a step of 4
questions holds 1.6 one-digit ones on average (README: why).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOOL_SHARE = 0.7  # of the held-out and SFT questions, the share that needs the tool


class Calculator:
    """The episode's calculator: a running total over the question's list, to which `add_line`
    adds one listed number at a time, named by its line. The policy never copies a 5-digit number
    into a call (the versions before did, and broke the chain at that copy: README). Its result
    says the list's length ("line 3 of 5"), so that whether the chain is done is read from the turn
    just before the choice to go on, not counted back in the question (the version before stopped
    a line or two short: README)."""

    def reset(self, numbers: list[int], **row) -> None:
        self.numbers, self.added, self.total = [int(n) for n in numbers], set(), 0

    def add_line(self, line: int) -> str:
        """Add the number on one line of the question's list to the running total.

        Args:
            line: The line's number in the list (1 for the first).
        """
        if isinstance(line, bool) or not isinstance(line, int) or not 1 <= line <= len(self.numbers):
            return f"There is no line {line}: the list has lines 1 to {len(self.numbers)}."
        if line in self.added:
            return f"Line {line} is already added. Total: {self.total}."
        self.added.add(line)
        self.total += self.numbers[line - 1]
        return f"Added line {line} of {len(self.numbers)}. Total: {self.total}."


def question(rng: random.Random, tool_share: float) -> dict:
    """A sum of 3 to 5 different numbers of 5 digits (`tool_share` of the questions), or of two
    one-digit numbers. The numbers are listed one to a line, each with its line number."""
    if rng.random() < tool_share:
        numbers = rng.sample(range(10_000, 100_000), rng.randint(3, 5))
    else:
        numbers = [rng.randint(1, 9), rng.randint(1, 9)]
    needs_tool = numbers[0] >= 10_000
    listing = "".join(f"\n{line}. {number}" for line, number in enumerate(numbers, 1))
    return {
        "prompt": f"Add these {len(numbers)} numbers:{listing}",
        "answer": str(sum(numbers)),
        "needs_tool": needs_tool,
        "calls_needed": len(numbers) if needs_tool else 0,
        "numbers": numbers,
    }


def transcript(row: dict, with_tool: bool) -> list[dict]:
    """A demonstrator's conversation, with the calculator or in its head.

    Both demonstrators first say how many digits the numbers have, then which way they add
    ("I add them with the calculator." / "I add them in my head: ..."): the choice is one word that
    follows a line the model wrote about the question, so that it can depend on it (the versions
    before chose at the reply's first token, and RL moved one share of calls for every question:
    README). With the calculator: one call per line, in order ("Line 2 of 4." and
    add_line(line=2)), each turn after the tool's "Added line 1 of 4. Total: 63075."; "All 4 added."
    ends the chain with the last total. In the head: the sum written out with its result at once."""
    numbers, answer = row["numbers"], row["answer"]
    count, digits = len(numbers), len(str(numbers[0]))
    opening = f"Each number has {digits} digit{'s' if digits > 1 else ''}. I add them"
    turns = [{"role": "user", "content": row["prompt"]}]
    if not with_tool:
        written = " + ".join(map(str, numbers)) + f" = {answer}"
        return turns + [{"role": "assistant", "content": f"{opening} in my head: {written}"}]
    calculator = Calculator()
    calculator.reset(numbers)
    for line in range(1, count + 1):
        said = f"{opening} with the calculator.\n" if line == 1 else ""
        call = json.dumps({"name": "add_line", "arguments": {"line": line}})
        turns += [
            {"role": "assistant", "content": f"{said}Line {line} of {count}.\n<tool_call>\n{call}\n</tool_call>"},
            {"role": "tool", "content": calculator.add_line(line)},
        ]
    return turns + [{"role": "assistant", "content": f"All {count} added. The sum is {calculator.total}."}]


def sft_rows(rows: list[dict], tokenizer) -> list[dict]:
    """Prompt/response rows for `hydrappo sft`, one per assistant turn: the prompt is the
    conversation so far as the policy sees it in an episode (the chat template, the calculator's
    description in the system turn, the tool turns), the response that turn's text; so the loss
    falls on the policy's turns only, never on a tool's result."""
    from hydrappo.agent import calls, toolbox

    schemas = [tool.schema for tool in toolbox.environment_tools(Calculator(), "Calculator")]
    out = []
    for row in rows:
        turns = transcript(row, row["demo_with_tool"])
        for end, turn in enumerate(turns):
            if turn["role"] == "assistant":
                messages = calls.episode_messages(turns[:end], schemas, None, None, template_renders_tools=False)
                prompt = tokenizer.decode(calls.prompt_ids(tokenizer, messages, schemas, False))
                out.append({"prompt": prompt, "response": turn["content"]})
    return out


def write_table(path: Path, rows: list[dict]) -> None:
    columns = ("prompt", "answer", "needs_tool", "calls_needed", "numbers")
    path.write_text("".join(json.dumps({c: r[c] for c in columns}) + "\n" for r in rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", type=int, default=1024)
    parser.add_argument("--held-out", type=int, default=120, help="held-out questions (noise about +-0.09 at 0.5)")
    parser.add_argument(
        "--train-tool-share",
        type=float,
        default=0.5,
        help="of the training questions, the share drawn as 5-digit sums (README: why not 0.7)",
    )
    parser.add_argument("--sft", type=int, default=900, help="synthetic transcripts for the SFT stage")
    parser.add_argument(
        "--sft-in-head",
        type=float,
        default=0.6,
        help="of the SFT's 5-digit sums, the share a demonstrator adds in its head (README: why)",
    )
    parser.add_argument(
        "--sft-small-with-tool",
        type=float,
        default=0.05,
        help="of the SFT's one-digit sums, the share a demonstrator adds with the calculator (README: why so few)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args(argv)
    shares = {
        "--train-tool-share": args.train_tool_share,
        "--sft-in-head": args.sft_in_head,
        "--sft-small-with-tool": args.sft_small_with_tool,
    }
    for option, share in shares.items():
        if not 0.0 <= share <= 1.0:
            parser.error(f"{option} is a share of the questions: give a number from 0 to 1, not {share}")
    args.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    rows, seen = [], set()
    while len(rows) < args.held_out + args.train + args.sft:
        training = args.held_out <= len(rows) < args.held_out + args.train
        row = question(rng, args.train_tool_share if training else TOOL_SHARE)
        # Held-out questions are never trained on; the small sums repeat (81 exist), so only the
        # held-out ones are kept apart from the rest.
        if row["prompt"] in seen:
            continue
        if len(rows) < args.held_out or row["needs_tool"]:
            seen.add(row["prompt"])
        rows.append(row)
    held_out, train, sft = rows[: args.held_out], rows[args.held_out : args.held_out + args.train], rows[-args.sft :]
    for row in sft:
        share = (1.0 - args.sft_in_head) if row["needs_tool"] else args.sft_small_with_tool
        row["demo_with_tool"] = rng.random() < share
    write_table(args.out / "train_prompts.jsonl", train)
    write_table(args.out / "eval_prompts.jsonl", held_out)
    from hydrappo.storage.models import load_tokenizer

    tokenizer = load_tokenizer("smollm2-135m-instruct")
    sft_table = sft_rows(sft, tokenizer)
    (args.out / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sft_table))
    needing = sum(r["needs_tool"] for r in held_out)
    chains = sum(r["demo_with_tool"] and r["needs_tool"] for r in sft)
    print(
        f"wrote {len(train)} training and {len(held_out)} held-out questions ({needing} need the tool) and "
        f"{len(sft)} SFT transcripts ({chains} chains of calls; {len(sft_table)} assistant turns) to {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
