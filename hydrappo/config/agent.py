"""The `agent:` section: multi-turn rollouts with tools and environments (TRL's GRPOTrainer names:
`tools`, `environment_factory`, `max_tool_calling_iterations`; agent/episodes.py runs them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .options import option, spec_list
from .values import Range, tokens

OnToolError = Literal["stop", "result"]


@dataclass
class AgentArgs:
    tools: str | None = option(
        None,
        "Tools the policy may call: 'path/to/file.py:function' or 'module:function', or several (a YAML list; "
        "comma-separated on the command line); plain functions with type hints and a Google-style docstring "
        "(their JSON schema is shown to the model). Any tool or environment_factory turns on multi-turn episodes.",
    )
    environment_factory: str | None = option(
        None,
        "'file.py:Class' (or a YAML mapping {name: 'file.py:Class'}, each row choosing one by its `environment` "
        "column): an object with reset(**row) (may return text appended to the prompt), public methods as "
        "tools, optional get_reward() (the episode's score, added with weight 1) and `done` (ends the episode).",
    )
    max_tool_calling_iterations: int | None = option(
        None, "Rounds of tool calls per episode (None: until max_episode_tokens).", tokens(1)
    )
    max_episode_tokens: int = option(
        256, "Tokens of an episode after its prompt, the policy's and the tool turns'.", tokens(1)
    )
    tool_call_parser: str = option(
        "qwen",
        "qwen (<tool_call>{json}</tool_call>, also 'hermes') or 'file.py:function' (text -> list of {name, arguments}).",
    )
    tool_timeout_s: float | None = option(
        30.0,
        "Seconds a tool call (or reset / get_reward) may take (None: no limit).",
        Range(0, low_open=True, fix="use the seconds one call may take, or null"),
    )
    on_tool_error: OnToolError = option(
        "stop",
        "A tool that raises, hangs or returns no text: stop (the run ends naming it) or result (the model reads the error as the tool turn).",
    )

    @property
    def enabled(self) -> bool:
        return bool(self.tools or self.environment_factory)

    @property
    def tool_specs(self) -> list:
        return spec_list(self.tools)
