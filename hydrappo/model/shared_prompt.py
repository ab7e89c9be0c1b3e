"""Rows that share a prompt pass it once: GRPO's G samples of a prompt (and PPO's, with
samples_per_prompt > 1) carry G copies of the same prompt tokens, and every copy costs the
trainable layers a forward (and, in the update, a backward) pass.

`pack_shared_prompts` lays each prompt out once, followed by the responses that share it,
in one packed row: [prompt | response 1 | response 2 | ...]. A 4-D attention mask lets every
response token see the prompt and its own response only (causally), and the position ids are
the original rows', so each token computes what it computes in its own row: the same keys,
the same positions, the same causal view. The idea is Prefix Grouper's (Liu et al. 2025,
"Prefix Grouper: Efficient GRPO Training through Shared-Prefix Forward", arXiv:2506.05433),
which splits the attention in two; here the model's own attention runs on the packed row,
through transformers' custom 4-D masks, so no architecture needs code of its own (the hydra
checks on a probe at load that the packed pass equals the plain one: model/probe.py).
`PromptPacking.unpack` scatters the packed hidden states back to the (B, W) rows; its
gather's backward sums the gradient of a shared prompt position over the rows that read it,
which is the gradient of the unpacked computation.

The saving is the repeated prompt tokens, and the responses' right padding (32 rows of 67 prompt
and 24 response columns in 8 groups, answers of about 17 tokens: 8 packed rows of about 140
tokens, padded to the longest, instead of 2912 tokens). Attention grows with the packed row's
length squared, so a group is cut into packed rows of at most `responses_per_row` responses,
chosen so that no packed row costs more attention than the rows it replaces
(responses_per_packed_row). plan_packing says whether a model's rows may be packed at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PromptPacking:
    """How B rows of width W map onto U packed rows of length L."""

    input_ids: torch.Tensor  # (U, L)
    position_ids: torch.Tensor  # (U, L), the original rows' positions
    attention_mask: torch.Tensor  # (U, 1, L, L): bool (True: attend), or additive float for eager attention
    source: torch.Tensor  # (U, L): each packed column's index in the flattened (B * W) rows
    target: torch.Tensor  # (B, W): each row column's index in the flattened (U * L) packed rows

    def pack(self, per_token: torch.Tensor) -> torch.Tensor:
        """(B, W, ...) -> (U, L, ...): a per-token tensor of the rows (the split hidden state) packed."""
        flat = per_token.reshape(-1, *per_token.shape[2:])
        return flat[self.source]

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """(U, L, ...) -> (B, W, ...): every row's columns read back from the packed rows."""
        flat = packed.reshape(-1, *packed.shape[2:])
        return flat[self.target]

    @property
    def packed_tokens(self) -> int:
        return self.input_ids.numel()


def responses_per_packed_row(prompt_width: int, response_width: int) -> int:
    """The most responses one packed row may hold so that its attention (length squared) is no
    more than that of the k rows of width P + R it replaces: (P + kR)^2 <= k (P + R)^2. 1 means
    that packing would not pay (responses as long as their prompts, or longer)."""
    width = prompt_width + response_width
    count = 1
    while (prompt_width + (count + 1) * response_width) ** 2 <= (count + 1) * width**2:
        count += 1
        if count >= 1024:
            break
    return count


def attention_window(config) -> int | None:
    """The shortest local attention window of a model's layers (sliding window, chunked
    attention), or None when every layer attends to the whole sequence."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    windows = [getattr(text, "attention_chunk_size", None)]
    if getattr(text, "use_sliding_window", True) is not False:
        windows.append(getattr(text, "sliding_window", None))
    windows = [window for window in windows if isinstance(window, int) and window > 0]
    return min(windows) if windows else None


def plan_packing(
    config,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    prompt_width: int,
    dtype: torch.dtype,
    responses_per_row: int | None = None,
) -> PromptPacking | None:
    """The packing of rows of the model with this `config` (pack_shared_prompts), or None where
    it would not pay, or would not be exact: rows longer than an attention window (the 4-D mask
    replaces the model's own masks, windows included). `dtype`: the hidden states' (eager
    attention adds the mask to its scores)."""
    width = input_ids.shape[1]
    window = attention_window(config)
    if window is not None and width > window:
        return None
    if responses_per_row is None:
        responses_per_row = responses_per_packed_row(prompt_width, width - prompt_width)
    eager = getattr(config, "_attn_implementation", None) == "eager"
    return pack_shared_prompts(
        input_ids,
        attention_mask,
        position_ids,
        prompt_width,
        responses_per_row=responses_per_row,
        additive_mask_dtype=dtype if eager else None,
    )


def pack_shared_prompts(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    prompt_width: int,
    *,
    responses_per_row: int,
    additive_mask_dtype: torch.dtype | None = None,
) -> PromptPacking | None:
    """The packing of rows laid out as prompt (columns < prompt_width, left-padded) + response
    (right-padded), or None when no two rows share a prompt, or a packed row could hold only one
    response. Rows share a prompt when their prompt columns (tokens and mask) are equal.
    `additive_mask_dtype`: build the mask as 0 / the dtype's minimum to add to the attention
    scores (eager attention), instead of a boolean one (scaled_dot_product_attention)."""
    rows, width = input_ids.shape
    response_width = width - prompt_width
    if responses_per_row < 2 or rows < 2 or response_width < 1 or prompt_width < 1:
        return None
    key = torch.cat([input_ids[:, :prompt_width], attention_mask[:, :prompt_width].to(input_ids.dtype)], dim=1)
    _, group_of_row = torch.unique(key, dim=0, return_inverse=True)
    groups: dict[int, list[int]] = {}
    for row, group in enumerate(group_of_row.tolist()):
        groups.setdefault(group, []).append(row)
    packed_rows = [
        members[start : start + responses_per_row]
        for members in groups.values()
        for start in range(0, len(members), responses_per_row)
    ]
    if len(packed_rows) == rows:
        return None
    # A response keeps its tokens up to its last real one: its right padding is not packed. The
    # rows' padding columns all read one padding column at the end of their packed row.
    columns = torch.arange(1, response_width + 1, device=attention_mask.device)
    kept = (attention_mask[:, prompt_width:].bool() * columns).amax(-1).tolist()
    lengths = [prompt_width + sum(kept[row] for row in members) + 1 for members in packed_rows]
    length = max(lengths)
    count = len(packed_rows)
    source = torch.zeros(count, length, dtype=torch.long)
    segment = torch.full((count, length), -1, dtype=torch.long)  # 0: the prompt, j: response j, -1: padding
    target = torch.empty(rows, width, dtype=torch.long)
    prompt_columns = torch.arange(prompt_width)
    for packed, members in enumerate(packed_rows):
        source[packed, :prompt_width] = members[0] * width + prompt_columns
        segment[packed, :prompt_width] = 0
        start = prompt_width
        padding_column = lengths[packed] - 1
        for slot, row in enumerate(members):
            response = torch.arange(kept[row])
            source[packed, start : start + kept[row]] = row * width + prompt_width + response
            segment[packed, start : start + kept[row]] = slot + 1
            target[row, :prompt_width] = packed * length + prompt_columns
            target[row, prompt_width:] = packed * length + padding_column
            target[row, prompt_width : prompt_width + kept[row]] = packed * length + start + response
            start += kept[row]
    device = input_ids.device
    source, segment, target = source.to(device), segment.to(device), target.to(device)
    valid = attention_mask.reshape(-1)[source].bool() & (segment >= 0)
    positions = torch.arange(length, device=device)
    causal = positions[None, :] <= positions[:, None]  # (query, key)
    same_part = (segment[:, None, :] == 0) | (segment[:, None, :] == segment[:, :, None])
    allowed = causal & same_part & valid[:, None, :] & valid[:, :, None]
    # A padding query sees itself only: a row with nothing to attend to is NaN, and its (unread)
    # output must stay finite for the backward pass.
    allowed |= torch.eye(length, dtype=torch.bool, device=device)
    mask = allowed[:, None]
    if additive_mask_dtype is not None:
        blocked = torch.finfo(additive_mask_dtype).min
        mask = torch.zeros(mask.shape, dtype=additive_mask_dtype, device=device).masked_fill(~mask, blocked)
    return PromptPacking(
        input_ids=input_ids.reshape(-1)[source],
        position_ids=position_ids.reshape(-1)[source],
        attention_mask=mask,
        source=source,
        target=target,
    )
