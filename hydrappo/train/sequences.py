"""Packed sequences: the split states recorded while sampling laid out as data.pack_sequences lays out
prompts and responses (pack_split_hidden), and the hydra's pass over them (experience_pass), which a
`Rollout` holds with the responses it packed.

Masks come from positions, never from comparing token ids with the pad id: with
SmolLM2 (and many chat models) the pad token IS the EOS token, so a real EOS and the
padding after it carry the same id.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch

from ..generation.responses import Responses
from ..model import HydraModel, HydraOutput
from ..model.heads import widened


@dataclass
class Rollout:
    """One process's rows of a PPO batch before scoring: its prompts, the responses sampled for
    them, the packed sequences and the hydra's pass over them (experience_pass)."""

    indices: list[int]  # rows of the prompt table, each G times in consecutive rows
    prompt_texts: list[str]
    responses: Responses
    response_texts: list[str]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    action_mask: torch.Tensor
    prompt_width: int
    evaluation: object  # experience_pass' output


def pack_split_hidden(responses: Responses, prompt_width: int, width: int) -> torch.Tensor | None:
    """The split hidden states recorded while sampling (None if none were), laid out as
    pack_sequences lays out the tokens (B, width, H): prompts right-aligned to `prompt_width`,
    responses after them. Padding holds zeros (any finite value does: attention never reads a
    padded position)."""
    if responses.split_hidden is None:
        return None
    first = responses.split_hidden[0]
    packed = first.new_zeros(len(responses.split_hidden), width, first.shape[-1])
    for i, (states, prompt) in enumerate(zip(responses.split_hidden, responses.prompt_ids)):
        start = prompt_width - len(prompt)
        packed[i, start : start + states.shape[0]] = states
    return packed


def response_part(out: HydraOutput, prompt_width: int) -> HydraOutput:
    """The response-aligned (B, R) float32 per-token tensors of a hydra pass over a packed
    batch (prompts left-padded to `prompt_width`, then responses): the one place that knows
    where the first response token's log-prob and value sit."""
    offset = prompt_width - 1

    def part(tensor, end=None):
        return widened(tensor[:, offset:end]) if tensor is not None else None

    return HydraOutput(
        logprobs=part(out.logprobs),
        values=part(out.values, -1),
        ref_logprobs=part(out.ref_logprobs),
        entropy=part(out.entropy),
        split_hidden=out.split_hidden,
        scores=out.scores,
    )


@torch.no_grad()
def experience_pass(
    hydra: HydraModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_width: int,
    *,
    temperature: float = 1.0,
    chunk_size: int = 16,
    autocast=None,
    with_reference: bool = True,
    split_hidden: torch.Tensor | None = None,
    share_prompts: bool = False,
) -> HydraOutput:
    """forward_hydra over the batch in chunks: response-aligned log-probs, reference
    log-probs, values and entropy, the split hidden state (kept for the PPO epochs), plus
    reward-branch scores when a branch is attached. The prompt's log-probs are never computed,
    and without `with_reference` (a KL coefficient of 0) the reference branch never runs.
    With `split_hidden` (pack_split_hidden of states recorded while sampling) the frozen
    bottom does not run again: only the branches do, and with `share_prompts` the rows of a
    chunk that share a prompt pass it once (model/shared_prompt.py)."""
    device = hydra.device
    names = ("logprobs", "ref_logprobs", "values", "entropy", "split_hidden", "scores")
    parts: dict[str, list] = {name: [] for name in names}
    for start in range(0, input_ids.shape[0], chunk_size):
        ids = input_ids[start : start + chunk_size].to(device)
        mask = attention_mask[start : start + chunk_size].to(device)
        with autocast() if autocast else nullcontext():
            out = hydra.forward_hydra(
                ids,
                mask,
                return_entropy=True,
                return_reference=with_reference,
                temperature=temperature,
                logprobs_from=prompt_width - 1,
                split_hidden=split_hidden[start : start + chunk_size] if split_hidden is not None else None,
                shared_prompt_width=prompt_width if share_prompts else None,
            )
        out = response_part(out, prompt_width)
        for name in names:
            parts[name].append(getattr(out, name))
    if split_hidden is not None:
        parts["split_hidden"] = [split_hidden]  # already whole: no concatenated copy
    return HydraOutput(**{name: _joined(values) for name, values in parts.items()})


def _joined(chunks: list):
    if not chunks or chunks[0] is None:
        return None
    return chunks[0] if len(chunks) == 1 else torch.cat(chunks)
