"""The `agent:` section: multi-turn rollouts with tools and environments (TRL's GRPOTrainer names:
`tools`, `environment_factory`, `max_tool_calling_iterations`; agent/episodes.py runs them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .options import spec_list
from .values import Range, tokens

OnToolError = Literal["stop", "result"]


@dataclass
class AgentArgs:
    tools: str | None = field(
        default=None,
        metadata={
            "help": "Tools the policy may call: 'path/to/file.py:function' or 'module:function', or several (a YAML list; "
            "comma-separated on the command line); plain functions with type hints and a Google-style docstring "
            "(their JSON schema is shown to the model). Any tool or environment_factory turns on multi-turn episodes."
        },
    )
    environment_factory: str | None = field(
        default=None,
        metadata={
            "help": "'file.py:Class' (or a YAML mapping {name: 'file.py:Class'}, each row choosing one by its `environment` "
            "column): an object with reset(**row) (may return text appended to the prompt), public methods as "
            "tools, optional get_reward() (the episode's score, added with weight 1) and `done` (ends the episode)."
        },
    )
    max_tool_calling_iterations: int | None = field(
        default=None,
        metadata={"help": "Rounds of tool calls per episode (None: until max_episode_tokens).", "range": tokens(1)},
    )
    max_episode_tokens: int = field(
        default=256,
        metadata={
            "help": "Tokens of an episode after its prompt, the policy's and the tool turns'.",
            "range": tokens(1),
        },
    )
    tool_call_parser: str = field(
        default="qwen",
        metadata={
            "help": "qwen (<tool_call>{json}</tool_call>, also 'hermes') or 'file.py:function' (text -> list of {name, arguments})."
        },
    )
    tool_timeout_s: float | None = field(
        default=30.0,
        metadata={
            "help": "Seconds a tool call (or reset / get_reward) may take (None: no limit).",
            "range": Range(0, low_open=True, fix="use the seconds one call may take, or null"),
        },
    )
    on_tool_error: OnToolError = field(
        default="stop",
        metadata={
            "help": "A tool that raises, hangs or returns no text: stop (the run ends naming it) or result (the model reads the error as the tool turn)."
        },
    )

    @property
    def enabled(self) -> bool:
        return bool(self.tools or self.environment_factory)

    @property
    def tool_specs(self) -> list:
        return spec_list(self.tools)
