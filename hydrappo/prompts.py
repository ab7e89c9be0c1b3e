"""Prompts: text or message lists (TRL's "conversational" format), formatted with the chat
template and tokenized.

A prompt column holds text, or message lists `[{"role": "user", "content": ...}, ...]`. Text
goes through the tokenizer's chat template as one user turn with `data.apply_chat_template`; a
message list always does (it has no other text), with `data.system_prompt` as a first turn
where it holds none. A list that ends with an assistant turn is continued: that turn's text is
the start of the response (TRL's `continue_final_message`).

Reward functions in TRL's convention get conversational prompts the way TRL's GRPOTrainer
passes them (`trl_arguments`): `prompts` as the message lists, without a final assistant turn,
and `completions` as `[{"role": "assistant", "content": text}]`, the continued turn's text first.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass

from .errors import DataError

logger = logging.getLogger("hydrappo")


def conversation_problem(value) -> str | None:
    """What keeps `value` from being a message list (a non-empty list of {"role": text,
    "content": text} turns), or None when it is one."""
    if not isinstance(value, (list, tuple)) or not value:
        return "is an empty list, not a list of messages"
    for number, message in enumerate(value, start=1):
        if not isinstance(message, dict) or not all(isinstance(message.get(key), str) for key in ("role", "content")):
            return f"holds {str(message)[:60]!r} as message {number}, not {{'role': text, 'content': text}}"
    return None


def conversation_column(values: list, where: str, unit: str, name: str) -> list[list[dict]]:
    """A prompt column of message lists, checked: every row one. The turns as written (`datasets`
    gives every turn each key any turn of the column has, the ones it lacks as None)."""
    for row, value in enumerate(values):
        problem = (
            conversation_problem(value)
            if isinstance(value, (list, tuple))
            else "is text while other rows hold message lists"
        )
        if problem:
            raise DataError(
                f"{where}: {unit} {row + 1}: the {name} {problem}; a {name} column holds text or message lists "
                '([{"role": "user", "content": text}, ...]), one kind.'
            )
    return [[{key: value for key, value in turn.items() if value is not None} for turn in value] for value in values]


def format_prompt(text: str | list, tokenizer, apply_chat_template: bool, system_prompt: str | None = None) -> str:
    """The text the model continues: text unchanged, or as a user turn of the tokenizer's chat
    template (after an optional system turn); a message list always through the chat template."""
    conversation = isinstance(text, list)
    if not apply_chat_template and not conversation:
        return text
    if not getattr(tokenizer, "chat_template", None):
        if conversation:
            raise DataError(
                "the prompts are message lists, which need the tokenizer's chat template, and it has none; use a "
                "tokenizer with a chat_template (model.tokenizer_name_or_path), or give the prompts as text."
            )
        raise DataError(
            "data.apply_chat_template is set but the tokenizer has no chat template; "
            "turn apply_chat_template off or use a tokenizer with a chat_template."
        )
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    if not conversation:
        return tokenizer.apply_chat_template(
            [*messages, {"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
    messages = [*(messages if text[0]["role"] != "system" else []), *text]
    continued = messages[-1]["role"] == "assistant"
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=not continued, continue_final_message=continued
    )


def trl_arguments(conversations: list[list[dict]], completions: list[str]) -> tuple[list, list]:
    """(prompts, completions) for a TRL-convention reward function, as TRL's GRPOTrainer builds
    them for conversational prompts: each prompt's turns without a final assistant turn, whose
    text starts the completion, `[{"role": "assistant", "content": text}]`. Copies: a function
    that changes them changes nothing else."""
    prompts, completed = [], []
    for conversation, text in zip(conversations, completions):
        turns = copy.deepcopy(list(conversation))
        start = turns.pop()["content"] if turns[-1]["role"] == "assistant" else ""
        prompts.append(turns)
        completed.append([{"role": "assistant", "content": start + text}])
    return prompts, completed


@dataclass
class PromptSet:
    texts: list[str]  # as loaded (a message list: as formatted)
    formatted: list[str]  # after the chat template (equal to texts without one)
    input_ids: list[list[int]]  # formatted and tokenized, at most max_prompt_length tokens
    messages: list[list[dict]] | None = None  # the message lists of conversational prompts (above)

    def __len__(self) -> int:
        return len(self.input_ids)


def tokenize_prompts(
    texts: list[str],
    tokenizer,
    max_prompt_length: int,
    apply_chat_template: bool = False,
    system_prompt: str | None = None,
) -> PromptSet:
    """Format and tokenize prompts; longer ones keep their last `max_prompt_length`
    tokens (the end is what the model continues), with one warning for all of them."""
    if max_prompt_length < 1:
        raise DataError(f"data.max_prompt_length must be at least 1, not {max_prompt_length}.")
    if not texts:
        raise DataError("no prompts to tokenize.")
    formatted = [format_prompt(t, tokenizer, apply_chat_template, system_prompt) for t in texts]
    # A chat template already writes the special tokens (BOS etc.); adding them again
    # would give the model a prompt it never saw in training.
    messages = [list(t) for t in texts] if isinstance(texts[0], list) else None
    encoded = tokenizer(formatted, add_special_tokens=not (apply_chat_template or messages))["input_ids"]
    input_ids, truncated = [], 0
    for i, ids in enumerate(encoded):
        if not ids:
            raise DataError(f"prompt {i} ({texts[i]!r}) tokenizes to no tokens; remove it.")
        if len(ids) > max_prompt_length:
            ids = ids[-max_prompt_length:]
            truncated += 1
        input_ids.append(list(ids))
    if truncated:
        logger.warning(
            "%d of %d prompts are longer than max_prompt_length=%d tokens and were truncated from the left to %d tokens.",
            truncated,
            len(texts),
            max_prompt_length,
            max_prompt_length,
        )
    return PromptSet(
        texts=formatted if messages else list(texts), formatted=formatted, input_ids=input_ids, messages=messages
    )
