"""What an RL step needs of multi-turn episodes (agent/episodes.py): the `agent:` options (or the
`tools=` / `environment_factory=` objects of the Python API) made into an `Agent` (whose `play`
plays prompt rows as episodes with the trainer's sampler), and what the rewards and the logs read
of the played episodes.

The reward functions see an episode as TRL's GRPOTrainer shows it to them: `completions` is the
policy's final reply (its answer), and two more keyword arguments, `transcripts` (the whole
episode after the prompt as text, tool turns included) and `environments` (each row's
environment instance), reach the functions that take them. An environment's `get_reward()`
is one more reward source, with weight 1 (TRL's rule), logged as env/reward/<its class>.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..generation.responses import Responses
from . import calls
from .episodes import Agent, summarize
from .toolbox import AgentSetupError, Environments, load_object, tool_of

EPISODE_COLUMNS = ("transcripts", "environments")  # what reward functions may take besides the columns


def load_agent_code(config) -> dict | None:
    """The user code agent: names, imported and checked (tool schemas, environments probed, the
    parser), before anything is written (train/inputs.py); None without tools or environments."""
    options = config.agent
    tools, factory = options.tool_specs, options.environment_factory
    if not tools and factory is None:
        return None
    base = Path(config.config_file).parent if getattr(config, "config_file", None) else None
    functions = [load_object(spec, base, "agent.tools") if isinstance(spec, str) else spec for spec in tools]
    standalone = [tool_of(fn) for fn in functions]
    if isinstance(factory, str):
        factory = load_object(factory, base, "agent.environment_factory")
    elif isinstance(factory, dict):
        factory = {
            name: load_object(spec, base, f"agent.environment_factory[{name!r}]") if isinstance(spec, str) else spec
            for name, spec in factory.items()
        }
    environments = Environments(factory, standalone, options.tool_timeout_s) if factory is not None else None
    parser = options.tool_call_parser
    if parser in calls.PARSERS:
        parse = calls.PARSERS[parser]
    elif ":" in parser:
        parse = calls.user_parser(load_object(parser, base, "agent.tool_call_parser"), f"tool-call parser {parser!r}")
    else:
        raise AgentSetupError(
            f"agent.tool_call_parser={parser!r} is neither {' nor '.join(calls.PARSERS)} nor "
            "'file.py:function' (a function from a turn's text to its calls)."
        )
    return {"tools": standalone, "environments": environments, "parse": parse}


def build_agent(config, tokenizer, code: dict | None) -> Agent | None:
    """The run's Agent from its loaded code (load_agent_code), or None without one."""
    if code is None:
        return None
    options = config.agent
    if not getattr(tokenizer, "chat_template", None):
        raise AgentSetupError(
            "multi-turn episodes need the tokenizer's chat template (its tool turn and assistant turns), and "
            "it has none; use a tokenizer with a chat_template (model.tokenizer_name_or_path)."
        )
    calls.tool_suffix_ids(tokenizer, [("probe", "x")])  # the template can append a tool turn: checked before training
    return Agent(
        tools=code["tools"],
        environments=code["environments"],
        parse=code["parse"],
        max_iterations=options.max_tool_calling_iterations,
        max_episode_tokens=options.max_episode_tokens,
        timeout_s=options.tool_timeout_s,
        on_error=options.on_tool_error,
        renders_tools=calls.renders_tools(tokenizer),
        tokenizer=tokenizer,
        generation=config.generation,
        system_prompt=config.data.system_prompt,
    )


def episode_columns(responses: Responses, tokenizer) -> dict:
    """The keyword arguments rewards may take of an episode (EPISODE_COLUMNS)."""
    return {
        "transcripts": tokenizer.batch_decode(responses.response_ids, skip_special_tokens=True),
        "environments": list(responses.environments),
    }


def gathered_statistics(responses: Responses, gather) -> dict:
    """agent/* of the whole batch: every process's episodes' statistics, gathered (`gather`: the
    process group's gather_rows), so the numbers do not depend on the number of processes."""
    keys = list(responses.episode_stats[0])
    table = gather(
        torch.tensor([[stats[key] for key in keys] for stats in responses.episode_stats], dtype=torch.float64)
    )
    return summarize([dict(zip(keys, row.tolist())) for row in table], "agent/")


def environment_scores(agent: Agent, responses: Responses, step: int | None) -> tuple[torch.Tensor | None, dict]:
    """Each episode's get_reward() (0 for an environment without one) and {env/reward/<class>: mean}."""
    if agent.environments is None or not any(agent.environments.has_reward.values()):
        return None, {}
    values, by_class = [], {}
    for instance in responses.environments:
        value = agent.environments.reward(instance, step)
        values.append(value or 0.0)
        if value is not None:
            by_class.setdefault(type(instance).__name__, []).append(value)
    return torch.tensor(values), {f"env/reward/{name}": sum(v) / len(v) for name, v in by_class.items()}
