"""Multi-turn rollouts: an episode is a conversation between the policy and its tools.

Each turn, the policy samples a reply to the conversation so far (any sampler: `sample` is the
trainer's sampler.sample); its tool calls (agent/calls.py's format) are executed, the turn's
calls of every episode together (agent/toolbox.py's run_calls, as user code), their results
appended as the chat template's tool turn, and the policy continues, until it answers without a call, its environment says it is done (its
`done` attribute), a turn is cut by `generation.max_new_tokens`, the episode has made
`max_tool_calling_iterations` rounds of calls (TRL's option; the calls of a turn past it are not
executed) or another turn would not fit in `max_episode_tokens`.

An episode is ONE sequence for training: its prompt, then every turn, the policy's and the tools'.
`Responses.policy_mask` marks the policy's tokens (its replies, each up to and including its
end-of-turn token); the tool turns (the template's tool messages and the next assistant header)
are 0 there, so the loss and the KL never count them, while the policy's later tokens still see
them as context. The episode always ends with a policy token (a call that is not executed adds no
tool turn), so the last action token, where the score lands, is the episode's last token.

The frozen bottom: each turn's sampling records the split states of every token fed
(generate_responses(record_split=True)); the last turn's states cover the whole episode, so the
experience pass runs only the top branches.

The KV cache: with a sampler that carries it (`carries_cache`: the decode loop), each episode keeps
its cache after a turn and the next turn extends it by the previous reply's last token and the
tool turn, instead of prefilling the conversation again; the cache's recorded split states come
along, so the last turn's states still cover the episode. The first turn shares the prefill of a
row's G episodes. Other samplers (generate, the graph step, the serving engines) prefill each
turn's whole context again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from ..config import GenerationArgs
from ..generation.responses import Responses
from . import calls as call_format
from .toolbox import Environments, Request, Tool, call_problem, ended, run_calls, toolset


@dataclass
class Agent:
    """What a run's episodes use, built once (agent/rollouts.py builds it from the options), and
    `play`, which plays prompt rows as episodes."""

    tools: list[Tool]  # the standalone tools
    environments: Environments | None
    parse: Callable[[str], list]  # a turn's text -> its Calls
    max_iterations: int | None  # rounds of tool calls per episode (None: until the token budget)
    max_episode_tokens: int  # every turn of an episode, the policy's and the tools'
    timeout_s: float | None
    on_error: str  # "stop" | "result"
    renders_tools: bool  # the chat template writes the tools' schemas itself
    tokenizer: object = None  # the policy's (its chat template renders every turn)
    generation: GenerationArgs | None = None  # each turn's sampling options
    system_prompt: str | None = None  # data.system_prompt, the first message of every episode

    def play(
        self, sample: Callable, prompts: list, columns: dict, rows: list[int], *, step, greedy=False, record_split=False
    ) -> Responses:
        """The rows `rows` of a prompt table (`prompts` and its other `columns`) played as episodes,
        each turn sampled by `sample` (the trainer's sampler.sample)."""
        table_rows = [{"prompt": prompts[i], **{name: values[i] for name, values in columns.items()}} for i in rows]
        messages = [messages_of(prompts[i]) for i in rows]
        episodes = start_episodes(self, self.tokenizer, table_rows, messages, self.system_prompt, step)
        return run_episodes(
            self, episodes, sample, self.tokenizer, self.generation, step=step, greedy=greedy, record_split=record_split
        )


def messages_of(prompt) -> list[dict]:
    """A prompt row as messages: text is one user turn."""
    return [dict(m) for m in prompt] if isinstance(prompt, list) else [{"role": "user", "content": prompt}]


@dataclass
class Episode:
    prompt_ids: list[int]
    tools: dict[str, Tool]
    environment: object | None
    tokens: list[int] = dataclasses.field(default_factory=list)  # every turn after the prompt
    policy: list[int] = dataclasses.field(default_factory=list)  # 1 where `tokens` are the policy's
    split_hidden: object = None  # the states recorded by its last turn
    final_text: str = ""  # the policy's last reply (the answer the rewards read)
    ended: bool = False  # the last turn ended with a stop (not cut by the token limit)
    running: bool = True
    cache: object = None  # the KV cache its last turn left (a sampler that carries_cache), for the next
    rounds: int = 0  # rounds of calls executed
    calls: int = 0
    valid_calls: int = 0
    failed_calls: int = 0


def start_episodes(
    agent: Agent, tokenizer, rows: list[dict], messages: list[list[dict]], system_prompt: str | None, step: int | None
) -> list[Episode]:
    """One episode per row: its environment (drawn from the pool and reset with the row's columns),
    its tools and its first prompt."""
    instances = (
        agent.environments.instances(agent.environments.names_of(rows)) if agent.environments else [None] * len(rows)
    )
    episodes = []
    for row, conversation, instance in zip(rows, messages, instances):
        observation = agent.environments.reset(instance, row, step) if instance is not None else None
        tools = agent.environments.tools_of(instance) if instance is not None else toolset(agent.tools)
        schemas = [tool.schema for tool in tools.values()]
        first = call_format.episode_messages(conversation, schemas, system_prompt, observation, agent.renders_tools)
        ids = call_format.prompt_ids(tokenizer, first, schemas, agent.renders_tools)
        episodes.append(Episode(prompt_ids=ids, tools=tools, environment=instance))
    return episodes


def run_episodes(
    agent: Agent,
    episodes: list[Episode],
    sample: Callable,
    tokenizer,
    args: GenerationArgs,
    *,
    step: int | None = None,
    greedy: bool = False,
    record_split: bool = False,
) -> Responses:
    """Play `episodes` to their end, turn by turn; `sample(prompt_ids, args, greedy=, record_split=)`
    -> Responses is the trainer's sampler. Returns the episodes as Responses (one row each, with
    policy_mask, final_texts and episode_stats). A `sample` that is the method of a sampler that
    carries_cache gets each episode's cache and extends it (`carried=`)."""
    carries = getattr(getattr(sample, "__self__", None), "carries_cache", False)
    while any(e.running for e in episodes):
        live = [e for e in episodes if e.running]
        carried = {"carried": [e.cache for e in live]} if carries else {}
        contexts = [e.prompt_ids + e.tokens for e in live]
        turn = sample(contexts, args, greedy=greedy, record_split=record_split, **carried)
        for index, episode in enumerate(live):
            reply = turn.response_ids[index]
            episode.tokens += reply
            episode.policy += [1] * len(reply)
            episode.ended = turn.ended[index]
            if record_split:
                episode.split_hidden = turn.split_hidden[index]
            episode.final_text = tokenizer.decode(reply, skip_special_tokens=True)
            episode.cache = turn.caches[index] if carries else None
        _tool_turns(agent, live, tokenizer, args, step)
        for episode in live:
            if not episode.running:
                episode.cache = None  # an ended episode's cache is memory no turn will read
    return Responses(
        prompt_ids=[e.prompt_ids for e in episodes],
        response_ids=[e.tokens for e in episodes],
        ended=[e.ended for e in episodes],
        split_hidden=[e.split_hidden for e in episodes] if record_split else None,
        policy_mask=[e.policy for e in episodes],
        final_texts=[e.final_text for e in episodes],
        environments=[e.environment for e in episodes],
        episode_stats=[episode_statistics(e) for e in episodes],
    )


def _tool_turns(agent: Agent, live: list[Episode], tokenizer, args: GenerationArgs, step: int | None) -> None:
    """Execute the calls of every live episode's last reply, all of the turn's calls together
    (toolbox.run_calls: concurrent but for the calls on one environment instance), and append each
    episode's tool turn; an episode that ends here stops running."""
    plans = [(episode, _calls_to_execute(agent, episode) if episode.ended else None) for episode in live]
    requests = [Request(c.call, episode.tools, c.problem) for episode, found in plans for c in found or ()]
    outcomes = iter(run_calls(requests, timeout_s=agent.timeout_s, on_error=agent.on_error, step=step))
    for episode, found in plans:
        done = [next(outcomes) for _ in found] if found else None
        episode.running = done is not None and _append_tool_turn(agent, episode, found, done, tokenizer, args)


def _calls_to_execute(agent: Agent, episode: Episode) -> list | None:
    """The calls of the episode's last reply to execute; None when it ends without any (an answer,
    or the round limit reached: its calls are judged but not executed)."""
    found = agent.parse(episode.final_text)
    if not found:
        return None  # an answer
    episode.calls += len(found)
    if agent.max_iterations is not None and episode.rounds >= agent.max_iterations:
        episode.valid_calls += sum(call_problem(c.call, episode.tools, c.problem) is None for c in found)
        return None
    return found


def _append_tool_turn(agent: Agent, episode: Episode, found: list, outcomes: list, tokenizer, args) -> bool:
    """Count the executed calls and append their tool turn; False when the episode ends here
    (the environment's `done`, or the next turn would not fit in the token budget)."""
    results = []
    for call, outcome in zip(found, outcomes):
        episode.valid_calls += outcome.valid
        episode.failed_calls += outcome.failed
        results.append((call.call["name"] if call.call else "unknown", outcome.text))
    episode.rounds += 1
    if ended(episode.environment):
        return False
    suffix = call_format.tool_suffix_ids(tokenizer, results)
    if len(episode.tokens) + len(suffix) + args.max_new_tokens > agent.max_episode_tokens:
        return False
    episode.tokens += suffix
    episode.policy += [0] * len(suffix)
    return True


def episode_statistics(episode: Episode) -> dict:
    """Per episode: calls written, of them valid (a known tool, arguments that fit), tool turns, failures."""
    return {
        "tool_calls": float(episode.calls),
        "valid_calls": float(episode.valid_calls),
        "called_validly": float(episode.valid_calls > 0),
        "tool_rounds": float(episode.rounds),
        "failed_calls": float(episode.failed_calls),
        "tokens": float(len(episode.tokens)),
    }


def summarize(stats: list[dict], prefix: str) -> dict:
    """Batch means of episode_statistics under `prefix` (agent/ or eval/agent/), and the valid-call
    rate: valid calls over calls written (absent when no call was written: a rate of nothing)."""
    if not stats:
        return {}
    count = len(stats)
    out = {f"{prefix}{key}_mean": sum(s[key] for s in stats) / count for key in stats[0]}
    written = sum(s["tool_calls"] for s in stats)
    if written:
        out[f"{prefix}valid_call_rate"] = sum(s["valid_calls"] for s in stats) / written
    return out
