"""Agents: tools the policy may call, environments it acts in, and the text of their turns.

TRL's GRPOTrainer conventions (`tools=[...]`, `environment_factory`, `max_tool_calling_iterations`):

- toolbox.py   tools from plain Python functions (their JSON schema from signature and docstring,
               transformers.utils.get_json_schema), environments (an object with `reset()`, its public
               methods as tools, an optional `get_reward()`), one environment per row, and calling
               all of it as user code (errors, time limits, sys.exit, non-string results), a turn's
               calls together (threads, async tools on one event loop; one instance's in order).
- calls.py     the tool-call format: parsing a turn's calls (Qwen / Hermes `<tool_call>{json}</tool_call>`
               by default, or a parser the user names), the tools' description in the prompt, and the
               tokens of a tool turn as the chat template renders it.
- episodes.py  the `Agent` (built once a run) and the episode loop: prompt rows played turn by turn
               with the trainer's sampler (generation/), one sequence per episode.
- rollouts.py  what an RL step needs: the Agent from the `agent:` options, the episodes' columns for
               the rewards, their gathered statistics, the environments' own rewards.

The options stay in config/agent.py (every option is config/'s).
"""
