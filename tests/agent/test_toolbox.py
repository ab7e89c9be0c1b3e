"""Tools and environments as TRL's GRPOTrainer takes them (hydrappo/agent/toolbox.py), and the
tool-call format (agent/calls.py): schemas from signatures and docstrings, the environment's
reset / methods / get_reward / per-row choice, and user code that fails (raises, hangs, returns
something that is not text, calls sys.exit) ending with a message that names it, or, when asked,
as a failed tool turn the model reads."""

import asyncio
import sys
import threading
import time

import pytest
from transformers import AutoTokenizer

from hydrappo.agent import calls, toolbox
from hydrappo.agent.toolbox import AgentSetupError, Environments, ToolError, run_call, tool_of, toolset

from runs import TINY


def add(a: int, b: int) -> int:
    """Add two whole numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def undocumented(a: int) -> int:
    return a


class Counter:
    """An environment: a counter the model moves; it scores how close it ends to the row's target."""

    def __init__(self):
        self.value, self.target, self.done = 0, 0, False

    def reset(self, target: int = 0, **row):
        self.value, self.target, self.done = 0, target, False
        return f" (start at 0, reach {target})"

    def increment(self, by: int) -> str:
        """Move the counter.

        Args:
            by: How far.
        """
        self.value += by
        self.done = self.value >= self.target
        return str(self.value)

    def get_reward(self) -> float:
        return -abs(self.value - self.target)

    def _private(self):
        pass


def test_a_function_is_a_tool_with_transformers_schema():
    tool = tool_of(add)
    assert tool.name == "add" and tool.schema["function"]["parameters"]["required"] == ["a", "b"]
    assert tool.schema["function"]["description"] == "Add two whole numbers."
    with pytest.raises(AgentSetupError, match="'undocumented'.*Google-style docstring"):
        tool_of(undocumented)
    with pytest.raises(AgentSetupError, match="two tools are named 'add'"):
        toolset([tool_of(add), tool_of(add)])


def test_environment_methods_are_its_tools_and_reset_starts_an_episode():
    envs = Environments(Counter, [tool_of(add)])
    names = envs.names_of([{"prompt": "p", "target": 3}] * 2)
    first, second = envs.instances(names)
    assert first is not second and envs.instances(names) == [first, second]  # pooled, reused next batch
    assert sorted(envs.tools_of(first)) == ["add", "increment"]  # not reset, get_reward or _private
    assert envs.reset(first, {"prompt": "p", "target": 3}, step=1) == " (start at 0, reach 3)"
    outcome = run_call(
        {"name": "increment", "arguments": {"by": 3}}, envs.tools_of(first), timeout_s=None, on_error="stop", step=1
    )
    assert outcome.text == "3" and outcome.valid and toolbox.ended(first) and envs.reward(first, step=1) == 0.0
    assert envs.reward(second, step=1) == 0.0 and second.value == 0  # each episode its own instance


def test_several_environments_chosen_by_the_environment_column():
    class Other:
        def reset(self, **row):
            self.row = row

    envs = Environments({"count": Counter, "other": Other}, [])
    rows = [{"environment": "other", "prompt": "p"}, {"environment": "count", "prompt": "q", "target": 1}]
    other, counter = envs.instances(envs.names_of(rows))
    assert isinstance(other, Other) and isinstance(counter, Counter)
    envs.reset(other, rows[0], step=0)
    assert other.row == {"prompt": "p"}  # the choosing column is not the environment's
    assert list(envs.tools_of(other)) == [] and list(envs.tools_of(counter)) == ["increment"]
    with pytest.raises(AgentSetupError, match="environment 'missing' in their `environment` column"):
        envs.names_of([{"environment": "missing"}])


def test_an_environment_without_reset_or_with_a_bad_reward_is_refused_clearly():
    class NoReset:
        pass

    with pytest.raises(AgentSetupError, match="without a callable reset"):
        Environments(NoReset, [])

    class BadReward(Counter):
        def get_reward(self):
            return None

    envs = Environments(BadReward, [])
    with pytest.raises(
        ToolError, match=r"BadReward.get_reward at step 4 returned NoneType None; get_reward returns one finite number"
    ):
        envs.reward(envs.instances([None])[0], step=4)


def test_the_models_mistakes_are_tool_turns_not_errors():
    tools = toolset([tool_of(add)])
    for call, expected in [
        ({"name": "mul", "arguments": {}}, "there is no tool named 'mul'; the tools are add"),
        ({"name": "add", "arguments": {"a": 1}}, "add cannot take these arguments: missing a required argument: 'b'"),
        ({"name": "add", "arguments": [1, 2]}, "must be a JSON object"),
    ]:
        outcome = run_call(call, tools, timeout_s=None, on_error="stop", step=0)
        assert not outcome.valid and expected in outcome.text
    outcome = run_call(None, tools, timeout_s=None, on_error="stop", step=0, problem="its body is not JSON")
    assert not outcome.valid and outcome.text == "Error: the tool call could not be read: its body is not JSON."


def raises(a: int) -> str:
    """Fails.

    Args:
        a: Anything.
    """
    raise RuntimeError("the service is down")


def hangs(a: int) -> str:
    """Never returns in time.

    Args:
        a: Anything.
    """
    threading.Event().wait(5)
    return "late"


def returns_none(a: int) -> str:
    """Forgets to return.

    Args:
        a: Anything.
    """


def exits(a: int) -> str:
    """Ends the process.

    Args:
        a: Anything.
    """
    sys.exit(3)


@pytest.mark.parametrize(
    "fn, message, reason",
    [
        (
            raises,
            r"tool 'raises' at step 2, called with \{'a': 1\} raised RuntimeError: the service is down \(test_toolbox.py, line \d+\)",
            "RuntimeError: the service is down",
        ),
        (
            hangs,
            r"tool 'hangs' at step 2, called with \{'a': 1\} did not return within 0.2 s \(agent.tool_timeout_s\)",
            "the call did not return within 0.2 s",
        ),
        (
            returns_none,
            r"tool 'returns_none' at step 2, called with \{'a': 1\} returned NoneType None; a tool returns text",
            "the tool returned NoneType, not text",
        ),
        (
            exits,
            r"tool 'exits' at step 2, called with \{'a': 1\} called sys.exit\(3\) \(SystemExit\); code the trainer runs must not end",
            "the tool tried to end the process",
        ),
    ],
)
def test_failing_user_code_is_its_own_error_or_a_failed_turn(fn, message, reason):
    tools = toolset([tool_of(fn)])
    call = {"name": fn.__name__, "arguments": {"a": 1}}
    with pytest.raises(ToolError, match=message):
        run_call(call, tools, timeout_s=0.2, on_error="stop", step=2)
    outcome = run_call(call, tools, timeout_s=0.2, on_error="result", step=2)
    assert outcome.valid and outcome.failed and outcome.text == f"Error: {reason}"


def test_qwen_tool_calls_are_parsed_and_broken_ones_say_why():
    text = 'I will add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    assert [c.call for c in calls.parse_tool_calls(text)] == [{"name": "add", "arguments": {"a": 1, "b": 2}}]
    assert calls.parse_tool_calls("The answer is 3.") == []
    broken = calls.parse_tool_calls('<tool_call>{"name": add}</tool_call><tool_call>[1]</tool_call><tool_call>{"name"')
    assert [c.problem for c in broken] == [
        "its body is not JSON (Expecting value)",
        'its body is not {"name": ..., "arguments": {...}}',
        "<tool_call> is not closed by </tool_call>",
    ]


def test_a_user_parser_and_its_failures():
    parse = calls.user_parser(
        lambda text: [{"name": "add", "arguments": {"a": 1, "b": 2}}] if "n5" in text else [],
        "tool-call parser 'p.py:parse' at step 1",
    )
    assert [c.call["name"] for c in parse("n4 n5")] == ["add"] and parse("n4") == []
    with pytest.raises(
        ToolError, match="tool-call parser 'p.py:parse' at step 1 returned str; a tool-call parser returns a list"
    ):
        calls.user_parser(lambda text: "add", "tool-call parser 'p.py:parse' at step 1")("n5")


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_the_tool_turn_is_the_templates_suffix_after_the_policys_end_of_turn():
    tokenizer = AutoTokenizer.from_pretrained(TINY / "model")
    tokenizer.chat_template = CHATML
    tokenizer.eos_token = "<|im_end|>"
    suffix = calls.tool_suffix_ids(tokenizer, [("add", "n7")])
    assert tokenizer.decode(suffix) == tokenizer.decode(
        tokenizer("\n<|im_start|>tool\nn7<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    )
    assert not calls.renders_tools(tokenizer)
    messages = calls.episode_messages([{"role": "user", "content": "n4"}], [tool_of(add).schema], "n9", " n5", False)
    assert messages[0]["role"] == "system" and messages[0]["content"].startswith("n9\n\nYou can call these functions")
    assert '"name": "add"' in messages[0]["content"] and messages[1] == {"role": "user", "content": "n4 n5"}

    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{{ messages | length }}{% endfor %}"
    with pytest.raises(AgentSetupError, match="does not preserve the conversation's prefix"):
        calls.tool_suffix_ids(tokenizer, [("add", "n7")])


# ---------------------------------------------------------------- the calls of a turn run together
def sleeper(seconds: float) -> str:
    """Sleeps, then says how long.

    Args:
        seconds: How long.
    """
    time.sleep(seconds)
    return f"slept {seconds}"


async def async_sleeper(seconds: float) -> str:
    """Sleeps without blocking the event loop, then says how long.

    Args:
        seconds: How long.
    """
    await asyncio.sleep(seconds)
    return f"awaited {seconds}"


async def async_exits(a: int) -> str:
    """Ends the process from a coroutine.

    Args:
        a: Anything.
    """
    await asyncio.sleep(0)
    sys.exit(4)


def requests_of(tools, *calls):
    return [toolbox.Request({"name": name, "arguments": arguments}, tools) for name, arguments in calls]


def timed(requests, **options):
    start = time.perf_counter()
    outcomes = toolbox.run_calls(requests, step=1, **{"timeout_s": 5.0, "on_error": "stop", **options})
    return outcomes, time.perf_counter() - start


@pytest.mark.parametrize("tool", [sleeper, async_sleeper])
def test_slow_calls_of_one_turn_take_the_longest_not_the_sum_and_answer_in_order(tool):
    tools = toolset([tool_of(tool)])
    # Written longest first: they finish in the reverse order, and still answer in the written one.
    outcomes, seconds = timed(requests_of(tools, *[(tool.__name__, {"seconds": s}) for s in (0.5, 0.4, 0.3)]))
    word = "slept" if tool is sleeper else "awaited"
    assert [o.text for o in outcomes] == [f"{word} 0.5", f"{word} 0.4", f"{word} 0.3"]
    # One after another they take 1.2 s; together the longest, 0.5 s, plus thread start-up (ms):
    # 1.0 s leaves half a second for a loaded machine and still fails a sequential run.
    assert 0.5 <= seconds < 1.0, seconds


def test_a_timeout_and_an_error_among_several_calls():
    tools = toolset([tool_of(sleeper), tool_of(hangs), tool_of(raises), tool_of(async_sleeper)])
    requests = requests_of(
        tools,
        ("sleeper", {"seconds": 0.2}),
        ("hangs", {"a": 1}),
        ("raises", {"a": 1}),
        ("async_sleeper", {"seconds": 5}),
        ("nope", {}),
    )
    outcomes, seconds = timed(requests, timeout_s=0.4, on_error="result")
    assert [(o.text, o.valid, o.failed) for o in outcomes] == [
        ("slept 0.2", True, False),
        ("Error: the call did not return within 0.4 s", True, True),
        ("Error: RuntimeError: the service is down", True, True),
        ("Error: the call did not return within 0.4 s", True, True),
        ("Error: there is no tool named 'nope'; the tools are sleeper, hangs, raises, async_sleeper.", False, False),
    ]
    assert seconds < 0.4 + 0.6, seconds  # the time limit once (the calls wait together), not twice
    # on_error "stop": the first failure in the written order ends the run, whichever failed first in time.
    with pytest.raises(ToolError, match=r"tool 'hangs' at step 1, called with \{'a': 1\} did not return within 0.4 s"):
        timed(requests, timeout_s=0.4)
    with pytest.raises(ToolError, match="tool 'raises' at step 1.* raised RuntimeError: the service is down"):
        timed(requests[2:4] + requests[:1], timeout_s=0.4)


def test_exits_from_threads_and_coroutines_are_the_tools_errors():
    tools = toolset([tool_of(exits), tool_of(async_exits), tool_of(sleeper)])
    for name in ("exits", "async_exits"):
        requests = requests_of(tools, ("sleeper", {"seconds": 0.1}), (name, {"a": 1}))
        with pytest.raises(ToolError, match=rf"tool '{name}' at step 1.* called sys.exit\(\d\) \(SystemExit\)"):
            timed(requests)
        outcomes, _ = timed(requests, on_error="result")
        assert outcomes[1].text == "Error: the tool tried to end the process" and outcomes[0].text == "slept 0.1"


class Ledger:
    """An environment whose calls must stay in order: each reads what the previous one wrote."""

    def reset(self, **row):
        self.entries = []

    def write(self, entry: str) -> str:
        """Append an entry after a pause.

        Args:
            entry: What to write.
        """
        seen = list(self.entries)
        time.sleep(0.2)
        self.entries = seen + [entry]
        return ",".join(self.entries)


def test_calls_on_one_environment_instance_stay_in_order_and_others_run_beside_them():
    envs = Environments(Ledger, [tool_of(sleeper)])
    first, second = envs.instances([None, None])
    for instance in (first, second):
        envs.reset(instance, {}, step=1)
    requests = [
        *requests_of(envs.tools_of(first), ("write", {"entry": "a"}), ("write", {"entry": "b"})),
        *requests_of(envs.tools_of(second), ("write", {"entry": "c"}), ("write", {"entry": "d"})),
        *requests_of(envs.tools_of(first), ("sleeper", {"seconds": 0.4})),
    ]
    outcomes, seconds = timed(requests)
    # Run together, the writes on one instance would each see an empty ledger and lose one another's entry.
    assert [o.text for o in outcomes] == ["a", "a,b", "c", "c,d", "slept 0.4"]
    # Each instance's two writes in sequence (0.4 s) beside the other's and the sleeper: not their sum, 1.2 s.
    assert 0.4 <= seconds < 0.9, seconds
