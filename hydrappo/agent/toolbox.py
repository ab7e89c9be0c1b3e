"""Tools and environments, as TRL's GRPOTrainer takes them, called as user code.

- A tool is a plain Python function with type hints and a Google-style docstring; its JSON schema
  (what the prompt shows the model) is transformers.utils.get_json_schema's.
- An environment factory is a callable (a class) whose instances have `reset(**row)` (the row's
  other columns as keyword arguments; it may return text, appended to the last user message), public
  methods (the episode's tools, besides the standalone ones), and optionally `get_reward()` (the
  episode's score, one more reward source) and a `done` attribute (true: the episode ends after the
  current tool turn; TRL has no such hook). A dict {name: factory} gives several environments, each
  row choosing one by its `environment` column, whose tools alone its prompt shows. Instances are
  pooled and reset between episodes, as TRL's are.

Everything the user wrote runs through `call_user`: an exception, a hang past the time limit, a
sys.exit or a result that is not text (or a number) is that code's error, reported with its name,
the step and the call, as a ToolError (no traceback of ours, and the checkpoints already written
stay), or, with `on_error="result"`, the text of a failed tool turn the model reads and is scored
on. A call the MODEL got wrong (an unknown tool, arguments that do not fit) is never the user's
error: the model reads what was wrong, as TRL does.

The calls of a turn run together (`run_calls`): standalone functions each in a thread, `async def`
tools awaited together on one event loop, the calls on one environment instance in the order
written (they share its state); results come back in the order written.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import numbers
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import usercode
from ..errors import HydrappoError, UsageError, shortened

RESERVED = ("reset", "get_reward")  # environment methods that are not tools (TRL's names)


class AgentSetupError(UsageError):
    """A tool or an environment cannot be used as given (no docstring, no reset, a bad spec)."""


class ToolError(HydrappoError):
    """A tool or an environment (user code) failed while training: the message names it, the
    step and the call."""

    exit_code = 1

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = reason or message  # the short form a failed tool turn shows the model


@dataclass(frozen=True)
class Tool:
    name: str
    fn: Callable
    schema: dict  # {"type": "function", "function": {...}}, get_json_schema's


def tool_of(fn: Callable, what: str = "tool") -> Tool:
    """A Tool from a function (or a bound method): its schema from its signature and docstring."""
    from transformers.utils import get_json_schema

    name = getattr(fn, "__name__", None)
    if not callable(fn) or name is None:
        raise AgentSetupError(
            f"{what} {fn!r} is not a function; tools are plain Python functions (or methods of an environment)."
        )
    try:
        schema = get_json_schema(fn)
    except Exception as error:  # transformers' DocstringParsingException / TypeHintParsingException
        raise AgentSetupError(
            f"{what} {name!r}: its JSON schema, which the prompt shows the model, cannot be built from its signature and "
            f"docstring: {error}. Give every argument a type hint and the function a Google-style docstring with a "
            "description and an `Args:` line per argument (transformers' get_json_schema reads them)."
        ) from None
    return Tool(name=name, fn=fn, schema=schema)


def environment_tools(instance, name: str) -> list[Tool]:
    """The public methods of an environment instance (not reset / get_reward) as tools."""
    methods = [
        m
        for n, m in inspect.getmembers(instance, predicate=inspect.ismethod)
        if not n.startswith("_") and n not in RESERVED
    ]
    return [tool_of(method, f"environment {name} method") for method in methods]


def toolset(tools: list[Tool]) -> dict[str, Tool]:
    """{name: tool}, refusing two tools of one name (the model could not tell them apart)."""
    named: dict[str, Tool] = {}
    for tool in tools:
        if tool.name in named:
            raise AgentSetupError(
                f"two tools are named {tool.name!r}; tool names must differ, as the model calls them by name."
            )
        named[tool.name] = tool
    return named


class Environments:
    """The environment factories of a run ({name: factory}; a single factory is {None: it}),
    probed once, and a pool of instances reused between episodes."""

    def __init__(self, factory, standalone: list[Tool], timeout_s: float | None = None):
        self.multi = isinstance(factory, dict)
        self.factories = dict(factory) if self.multi else {None: factory}
        self.standalone, self.timeout_s = standalone, timeout_s
        self.pool: dict = {}
        self.has_reward: dict = {}
        for name, make in self.factories.items():
            label = self.label(name, make)
            if not callable(make):
                raise AgentSetupError(
                    f"{label} is {make!r}, which is not callable; pass a class or a function that returns an environment."
                )
            instance = call_user(make, f"{label} (building an instance)", timeout_s=timeout_s)
            if not callable(getattr(instance, "reset", None)):
                raise AgentSetupError(
                    f"{label} built a {type(instance).__name__} without a callable reset(); an environment "
                    "defines reset(**row), which starts an episode (it may return text for the prompt)."
                )
            toolset(standalone + environment_tools(instance, label))  # schemas and names checked before training
            self.has_reward[name] = callable(getattr(instance, "get_reward", None))
            self.pool[name] = [instance]

    @staticmethod
    def label(name, make) -> str:
        kind = getattr(make, "__name__", type(make).__name__)
        return f"environment {kind!r}" + (f" ({name!r})" if name is not None else "")

    def names_of(self, rows: list[dict]) -> list:
        """Each row's environment name (its `environment` column with several environments)."""
        if not self.multi:
            return [None] * len(rows)
        names = [row.get("environment") for row in rows]
        unknown = sorted({str(n) for n in names if n not in self.factories})
        if unknown:
            raise AgentSetupError(
                f"rows name environment {', '.join(map(repr, unknown))} in their `environment` column, which is not among the "
                f"environments given ({', '.join(map(repr, self.factories))}); fix the column or add that environment."
            )
        return names

    def instances(self, names: list) -> list:
        """One pooled instance per episode (more are built when a batch needs them)."""
        handed: dict = {}
        out = []
        for name in names:
            pool, index = self.pool[name], handed.get(name, 0)
            if index == len(pool):
                pool.append(
                    call_user(
                        self.factories[name],
                        f"{self.label(name, self.factories[name])} (building an instance)",
                        timeout_s=self.timeout_s,
                    )
                )
            handed[name] = index + 1
            out.append(pool[index])
        return out

    def reset(self, instance, row: dict, step: int | None) -> str | None:
        """Start an episode: reset(**row) (without the `environment` column of several environments)."""
        kwargs = {k: v for k, v in row.items() if not (self.multi and k == "environment")}
        accepts_any = any(p.kind is p.VAR_KEYWORD for p in inspect.signature(instance.reset).parameters.values())
        if not accepts_any:
            kwargs = {k: v for k, v in kwargs.items() if k in inspect.signature(instance.reset).parameters}
        observation = call_user(
            instance.reset, f"{type(instance).__name__}.reset{_at(step)}", timeout_s=self.timeout_s, **kwargs
        )
        if observation is not None and not isinstance(observation, str):
            raise ToolError(
                f"{type(instance).__name__}.reset{_at(step)} returned {type(observation).__name__} {shortened(observation)}; "
                "reset returns None or text, which is appended to the row's last user message."
            )
        return observation

    def tools_of(self, instance) -> dict[str, Tool]:
        return toolset(self.standalone + environment_tools(instance, type(instance).__name__))

    def reward(self, instance, step: int | None) -> float | None:
        """The episode's score from the environment's own get_reward(), or None without one."""
        if not callable(getattr(instance, "get_reward", None)):
            return None
        where = f"{type(instance).__name__}.get_reward{_at(step)}"
        value = call_user(instance.get_reward, where, timeout_s=self.timeout_s)
        if (
            not isinstance(value, numbers.Real)
            or isinstance(value, bool)
            or value != value
            or abs(value) == float("inf")
        ):
            raise ToolError(
                f"{where} returned {type(value).__name__} {shortened(value)}; get_reward returns one finite number, "
                "the episode's score."
            )
        return float(value)


def ended(instance) -> bool:
    """Whether the environment says its episode is over (a true `done` attribute)."""
    return bool(getattr(instance, "done", False)) if instance is not None else False


@dataclass
class Outcome:
    text: str  # the tool turn's content
    valid: bool  # the model named a tool and gave arguments that fit its signature
    failed: bool = False  # the tool itself failed (on_error="result")


@dataclass(frozen=True)
class Request:
    """One call to execute: the parsed call {"name", "arguments"} (None: the model's call did not
    parse, `problem` says why) and the tools of its episode."""

    call: dict | None
    tools: dict[str, Tool]
    problem: str | None = None


def run_call(
    call: dict | None,
    tools: dict[str, Tool],
    *,
    timeout_s: float | None,
    on_error: str,
    step: int | None,
    problem: str | None = None,
) -> Outcome:
    """Execute one parsed call {"name", "arguments"} (None: the model's call did not parse, `problem` says why)."""
    return run_calls([Request(call, tools, problem)], timeout_s=timeout_s, on_error=on_error, step=step)[0]


def run_calls(requests: list[Request], *, timeout_s: float | None, on_error: str, step: int | None) -> list[Outcome]:
    """Execute calls together, each under `timeout_s`; their outcomes in the order written.

    What runs beside what: the calls of one object's methods (an environment instance's tools)
    run one after another in the order written, since they share its state (a move, then the
    score it leaves); every other call (a standalone function) runs beside them, each in a
    thread of its own, so the calls of a turn take about as long as the slowest. `async def`
    tools are awaited together on one event loop (`event_loop`), TRL's way. A model's mistake is
    answered without running anything. With on_error "stop", a failure ends the run: the first
    one in the order written is raised once the calls already started have returned (each within
    its time limit), and the calls after it on the same object are not made. When everything is
    one sequence (one call, or one object's), it runs in the caller's thread, as one call always did."""
    outcomes: list = [None] * len(requests)
    lanes: dict = {}  # what must run in order: one object's calls, or a single call
    for index, request in enumerate(requests):
        mistake = call_problem(request.call, request.tools, request.problem)
        if mistake:
            outcomes[index] = Outcome(f"Error: {mistake}.", valid=False)
            continue
        owner = getattr(request.tools[request.call["name"]].fn, "__self__", None)
        lanes.setdefault(("object", id(owner)) if owner is not None else ("call", index), []).append(index)

    def run_lane(indices: list[int]) -> None:
        for index in indices:
            try:
                outcomes[index] = _execute(requests[index], timeout_s, on_error, step)
            except BaseException as error:  # raised in the caller's thread, below
                outcomes[index] = error
                return  # the run ends with it: nothing more on this object

    if len(lanes) == 1:
        run_lane(next(iter(lanes.values())))
    elif lanes:
        _in_threads(run_lane, list(lanes.values()))
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return outcomes


def _in_threads(run_lane: Callable, lanes: list[list[int]]) -> None:
    """run_lane(lane) for every lane at once, each in a daemon thread (a call that hangs past its
    time limit is left behind, never waited for at exit), with the caller's grad mode."""
    import torch  # here: config/ imports usercode, and loads no torch

    grad = torch.is_grad_enabled()

    def target(lane):
        with torch.set_grad_enabled(grad):
            run_lane(lane)

    threads = [threading.Thread(target=target, args=(lane,), name="hydrappo-tool-call", daemon=True) for lane in lanes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _execute(request: Request, timeout_s: float | None, on_error: str, step: int | None) -> Outcome:
    """A valid call run as user code: its text, or (on_error "result") its failure as the text."""
    name, arguments = request.call["name"], request.call.get("arguments", {})
    where = f"tool {name!r}{_at(step)}, called with {shortened(arguments)}"
    try:
        result = call_user(request.tools[name].fn, where, timeout_s=timeout_s, **arguments)
        return Outcome(tool_text(result, where), valid=True)
    except ToolError as error:
        if on_error != "result":
            raise
        return Outcome(f"Error: {error.reason}", valid=True, failed=True)


def call_problem(call: dict | None, tools: dict[str, Tool], problem: str | None = None) -> str | None:
    """What is wrong with a call the model wrote (None: a known tool, arguments that fit its signature)."""
    if call is None:
        return f"the tool call could not be read: {problem}"
    name, arguments = call.get("name"), call.get("arguments", {})
    if name not in tools:
        return f"there is no tool named {name!r}; the tools are {', '.join(tools) or 'none'}"
    if not isinstance(arguments, dict):
        return f"the arguments of {name} must be a JSON object, not {json.dumps(arguments)}"
    try:
        inspect.signature(tools[name].fn).bind(**arguments)
    except TypeError as error:
        return f"{name} cannot take these arguments: {error}"
    return None


def tool_text(result, where: str) -> str:
    """A tool's result as the tool turn's text: a string as it is, a number written out (TRL's
    examples return ints); anything else is the tool's error, not a guess at how to print it."""
    if isinstance(result, str):
        return result
    if isinstance(result, numbers.Number):
        return str(result)
    raise ToolError(
        f"{where} returned {type(result).__name__} {shortened(result)}; a tool returns text (a str, or a number), "
        "which becomes the tool turn the model reads.",
        reason=f"the tool returned {type(result).__name__}, not text",
    )


def call_user(fn: Callable, where: str, *, timeout_s: float | None = None, **kwargs):
    """fn(**kwargs) as user code: its failures become ToolErrors naming `where`. An `async def`
    function is awaited on the tools' event loop (`awaited`)."""
    try:
        if inspect.iscoroutinefunction(fn):
            return awaited(fn, where, timeout_s, kwargs)
        return usercode.call_with_timeout(lambda **kw: usercode.call(fn, where, **kw), kwargs, timeout_s)
    except usercode.TimedOut:
        raise ToolError(
            f"{where} did not return within {timeout_s} s (agent.tool_timeout_s); make it faster or raise the limit.",
            reason=f"the call did not return within {timeout_s} s",
        ) from None
    except usercode.UserCodeError as error:
        raise ToolError(str(error), reason="the tool tried to end the process") from None
    except Exception as error:
        raise ToolError(
            f"{where} raised {type(error).__name__}: {error}{usercode.user_frame(error)}. Fix it, set "
            "agent.on_tool_error: result to show the model the error instead, or rerun with --debug for the traceback.",
            reason=f"{type(error).__name__}: {error}",
        ) from error


_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()


def event_loop() -> asyncio.AbstractEventLoop:
    """The event loop async tools run on: one per process, running in a daemon thread from its
    first use on, so the coroutines of concurrent calls are awaited together, a loop-bound
    resource a tool keeps (an HTTP session) stays usable from call to call, and the loop never
    holds the process at exit. An async tool that blocks (time.sleep, not asyncio.sleep) stops
    the loop for every async call: they then end by their time limits."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            _LOOP = asyncio.new_event_loop()
            threading.Thread(target=_LOOP.run_forever, name="hydrappo-tool-loop", daemon=True).start()
        return _LOOP


def awaited(fn: Callable, where: str, timeout_s: float | None, kwargs: dict):
    """An async function's result, awaited on `event_loop()` as user code (sys.exit inside it is
    its error); usercode.TimedOut (and the coroutine cancelled) past `timeout_s`."""

    async def guarded():
        with usercode.running(where):
            return await fn(**kwargs)

    future = asyncio.run_coroutine_threadsafe(guarded(), event_loop())
    done, _ = concurrent.futures.wait([future], timeout=timeout_s)
    if not done:  # not future.result(timeout): a TimeoutError the tool raises itself is its own error
        future.cancel()
        raise usercode.TimedOut
    return future.result()


def _at(step: int | None) -> str:
    return f" at step {step}" if step is not None else ""


def load_object(spec: str, base_dir: str | Path | None, what: str):
    """The object a config names ('path/to/file.py:name' or 'package.module:name'), by the one
    user-code loader: a file that also holds a reward function is the same module."""
    return usercode.load_object(spec, base_dir, what, AgentSetupError)
