"""The tool-call format in text and tokens: what the prompt tells the model, how a turn's calls are
read, and the tokens of the tool turn that answers them.

- The prompt: the tokenizer's chat template renders the tools' schemas when it knows how (it then
  renders `tools=`); a template that ignores them (SmolLM2's) gets the tools and Qwen2.5's call
  format in its system turn instead, so the model sees the same format it is asked to write.
- A turn's calls: Qwen / Hermes `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks by
  default (`parse_tool_calls`); a parser the user names takes a turn's text and returns its calls.
- The tool turn: its tokens are the suffix the chat template adds to a conversation for the tool
  messages (and the next assistant header), TRL's `_get_tool_suffix_ids` method: render the
  conversation up to its last end-of-turn token, render it again with the tool messages, keep what
  the second adds. The template must preserve the prefix (an earlier turn renders the same with
  more after it); `tool_suffix_ids` checks it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from .toolbox import AgentSetupError

CALL_BLOCK = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.S)

# The tools' description for templates that render none: Qwen2.5's tags (<tools>, <tool_call>), in
# fewer words than its template's (a small model's every turn prefills this text again).
TOOLS_PREAMBLE = (
    "You can call these functions:\n<tools>\n{tools}\n</tools>\nTo call one, write <tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


@dataclass
class Call:
    """One call the model wrote: `call` {"name", "arguments"}, or None with the `problem`."""

    call: dict | None
    problem: str | None = None


def parse_tool_calls(text: str) -> list[Call]:
    """The calls of a turn in Qwen / Hermes format; [] when it has none (an answer). A block that
    is not JSON with a "name" is a Call with its problem (the model reads it, the turn counts as
    an invalid call)."""
    calls = []
    for match in CALL_BLOCK.finditer(text):
        body, closed = match.group(1).strip(), bool(match.group(2))
        if not closed:
            calls.append(Call(None, "<tool_call> is not closed by </tool_call>"))
            continue
        try:
            value = json.loads(body)
        except json.JSONDecodeError as error:
            calls.append(Call(None, f"its body is not JSON ({error.msg})"))
            continue
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            calls.append(Call(None, 'its body is not {"name": ..., "arguments": {...}}'))
            continue
        arguments = value.get("arguments", value.get("parameters", {}))
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass
        calls.append(Call({"name": value["name"], "arguments": arguments}))
    return calls


PARSERS: dict[str, Callable[[str], list[Call]]] = {"qwen": parse_tool_calls, "hermes": parse_tool_calls}


def user_parser(fn: Callable, where: str) -> Callable[[str], list[Call]]:
    """A parser the user wrote, fn(text) -> list of {"name", "arguments"} dicts (or strings, each
    the problem of a call that did not parse), as a parser of Calls."""
    from .toolbox import ToolError, call_user

    def parse(text: str) -> list[Call]:
        result = call_user(fn, where, text=text) if _takes_text(fn) else call_user(lambda: fn(text), where)
        if not isinstance(result, (list, tuple)):
            raise ToolError(
                f"{where} returned {type(result).__name__}; a tool-call parser returns a list of "
                '{"name": ..., "arguments": {...}} dicts (empty: the turn calls nothing).'
            )
        return [Call(None, item) if isinstance(item, str) else Call(dict(item)) for item in result]

    return parse


def _takes_text(fn) -> bool:
    import inspect

    try:
        return "text" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def renders_tools(tokenizer) -> bool:
    """Whether the chat template writes the tools it is given (else their description goes in the system turn)."""
    probe = [{"role": "user", "content": "hi"}]
    schema = {
        "type": "function",
        "function": {"name": "probe_tool", "description": "d", "parameters": {"type": "object", "properties": {}}},
    }
    try:
        with_tools = tokenizer.apply_chat_template(probe, tools=[schema], tokenize=False, add_generation_prompt=True)
    except Exception:
        return False
    return "probe_tool" in with_tools


def tools_system_text(schemas: list[dict]) -> str:
    """The tools (their functions' name, description and parameters, one JSON line each) and how to call them."""
    functions = [{k: v for k, v in schema.get("function", schema).items() if k != "return"} for schema in schemas]
    return TOOLS_PREAMBLE.format(tools="\n".join(json.dumps(f, ensure_ascii=False) for f in functions))


def episode_messages(
    messages: list[dict],
    schemas: list[dict],
    system_prompt: str | None,
    observation: str | None,
    template_renders_tools: bool,
) -> list[dict]:
    """The episode's first messages: the row's messages, the environment's reset text appended to
    the last user message (TRL's rule), the tools described in the system turn when the template
    does not render them."""
    messages = [dict(m) for m in messages]
    if observation:
        last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
        messages[last_user]["content"] += observation
    if system_prompt and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system_prompt})
    if schemas and not template_renders_tools:
        if messages[0]["role"] == "system":
            messages[0]["content"] = messages[0]["content"] + "\n\n" + tools_system_text(schemas)
        else:
            messages.insert(0, {"role": "system", "content": tools_system_text(schemas)})
    return messages


def prompt_ids(tokenizer, messages: list[dict], schemas: list[dict], template_renders_tools: bool) -> list[int]:
    """The episode's prompt tokens (the chat template, its generation prompt)."""
    extra = {"tools": schemas} if schemas and template_renders_tools else {}
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def tool_suffix_ids(tokenizer, results: list[tuple[str, str]]) -> list[int]:
    """The tokens that follow an assistant turn's end-of-turn token: the tool messages `results`
    [(tool name, text)] and the next assistant header, as the chat template renders them."""
    dummy = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    tools = [{"role": "tool", "name": name, "content": text} for name, text in results]
    prefix = tokenizer.apply_chat_template(dummy, tokenize=False, add_generation_prompt=False)
    full = tokenizer.apply_chat_template(dummy + tools, tokenize=False, add_generation_prompt=True)
    eos = tokenizer.eos_token
    if eos and eos in prefix:  # cut after the last end-of-turn token ("<|im_end|>"), where the policy stopped
        prefix = prefix[: prefix.rindex(eos) + len(eos)]
    if not full.startswith(prefix):
        raise AgentSetupError(
            "the chat template does not preserve the conversation's prefix when a tool message follows (the earlier turns "
            "render differently), so a tool turn cannot be appended to what the policy generated; use a template that "
            "renders each turn independently (model.tokenizer_name_or_path, or a tokenizer whose chat_template you set)."
        )
    return tokenizer(full[len(prefix) :], add_special_tokens=False)["input_ids"]
