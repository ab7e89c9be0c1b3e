"""Generation on the hydra's own model: prompts in, `Responses` out, in chunks of
`generation_batch_size` rows (the samplers that call it are in samplers.py).

A chunk is sampled by transformers' `generate` or by hydrappo's decode loop (decode.py,
CHUNK_SAMPLERS); identical consecutive prompts (a prompt's G samples) are prefilled once
(shared_prefill); the frozen bottom's output is recorded while sampling (record_split_hidden),
so the experience pass runs only the top branches; rows are trimmed at their first stop
(stops.py). With the decode loop, an episode's turns carry their KV cache: each row's cache is
kept after a turn (Responses.caches) and the next turn extends it (carried_prefill) instead of
prefilling the whole conversation again.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
from transformers import DynamicCache, GenerationConfig, StoppingCriteriaList

from ..config import GenerationArgs
from ..data import left_pad
from ..model import HydraModel
from ..model.arch import cache_argument, output_cache
from ..model.split import position_ids_from_mask
from .decode import PreallocatedLayer, RowCache, SamplingRule, decode
from .stops import StopOnStrings, first_stop


@dataclass
class Responses:
    """Sampled responses of one batch, trimmed at their first stop."""

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]  # each includes its stop token (EOS or stop id), if any
    ended: list[bool]  # stopped by EOS, a stop token id or a stop string (not by length)
    # Per row, the frozen bottom's output for its prompt and response tokens (L_p + L_r, H),
    # recorded while sampling (generate_responses(record_split=True)); else None.
    split_hidden: list[torch.Tensor] | None = None
    # Multi-turn episodes (episodes.py): per row, 1 on the policy's tokens of response_ids and 0 on
    # the tool turns'; the policy's last reply (what the rewards read); each row's environment and
    # its episode's statistics. None for one reply per prompt.
    policy_mask: list[list[int]] | None = None
    final_texts: list[str] | None = None
    environments: list | None = None
    episode_stats: list[dict] | None = None
    # Per row, its KV cache for the next turn to extend (generate_responses(carried=...)); else None.
    caches: list[RowCache | None] | None = None


def generation_config(args: GenerationArgs, tokenizer, greedy: bool = False) -> GenerationConfig:
    """Sampling settings for transformers' generate. Everything is explicit so that a
    model's own generation_config.json (SmolLM2 ships temperature 0.2, top_p 0.9) cannot
    silently change the distribution PPO's log-probs are computed under. `greedy`: the most
    likely token at each step (held-out evaluation), with the same stops and limits."""
    eos_ids = [tokenizer.eos_token_id, *args.stop_token_ids]
    sampling = {} if greedy else {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p}
    return GenerationConfig(
        do_sample=not greedy,
        **sampling,
        max_new_tokens=args.max_new_tokens,
        min_new_tokens=args.min_new_tokens,
        eos_token_id=eos_ids,
        pad_token_id=tokenizer.pad_token_id,
        use_cache=True,
        repetition_penalty=1.0,
        num_beams=1,
    )


@torch.no_grad()
def generate_responses(
    hydra: HydraModel,
    tokenizer,
    prompts: list[list[int]],
    args: GenerationArgs,
    synced: bool = False,
    record_split: bool = False,
    share: bool | None = None,
    greedy: bool = False,
    loop: str = "generate",
    carried: list[RowCache | None] | None = None,
) -> Responses:
    """Sample one response per prompt with the policy, in chunks of `generation_batch_size`.
    `loop`: "generate" (transformers' generate) or "decode" (hydrappo's own loop, decode.py: the
    same distribution, less work per token, ended rows leave the batch), or a chunk function of
    _decode_chunk's signature (graph_decode.py's static step).
    `synced` (generate only): the trunk is sharded over processes (FSDP), so every process runs every token
    step until all are done (transformers' synced_gpus), each layer's gather meeting the others'.
    `record_split`: keep the frozen bottom's output for every prompt and response token, which
    sampling computes anyway (see record_split_hidden), so the experience pass can skip it.
    `share` (default: args.share_prompt_prefill): identical consecutive prompts are prefilled once.
    `greedy`: greedy decoding instead of sampling (see generation_config). `hydra` may be a plain
    transformers model (`hydrappo compare`): it samples, but neither records nor shares.
    `carried` (the decode loop only): per prompt, the KV cache its previous turn left (None: none),
    whose tokens the prompt starts with; the prompt is then fed from where its cache ends
    (carried_prefill), and Responses.caches holds each row's cache for its next turn."""
    is_hydra = isinstance(hydra, HydraModel)
    share = (args.share_prompt_prefill if share is None else share) and is_hydra and not synced
    sample_chunk = loop if callable(loop) else CHUNK_SAMPLERS[loop]
    if carried is not None and sample_chunk is not _decode_chunk:
        raise ValueError("only the decode loop carries a KV cache from turn to turn")
    caches = [] if carried is not None else None
    stop_ids = {tokenizer.eos_token_id, *args.stop_token_ids}
    responses, ended, split_rows = [], [], []
    for start in range(0, len(prompts), args.generation_batch_size):
        # One chunk per call: its KV cache and recorded steps are freed before the next chunk starts.
        chunk = prompts[start : start + args.generation_batch_size]
        input_ids, attention_mask = (t.to(hydra.device) for t in left_pad(chunk, tokenizer.pad_token_id))
        # G samples of one prompt sit in consecutive rows: run each distinct prompt once (all
        # but its last token) and hand the loop the cache, repeated for its rows.
        shared = None
        if carried is not None:
            rows_carried = carried[start : start + args.generation_batch_size]
            shared = carried_prefill(chunk, rows_carried, input_ids, attention_mask, args.max_new_tokens, record_split)
        if shared is None and share:
            shared = shared_prefill(hydra, chunk, input_ids, attention_mask, record_split)
        keep = {"caches": caches} if caches is not None else {}
        rows, states = sample_chunk(
            hydra,
            tokenizer,
            input_ids,
            attention_mask,
            args,
            greedy=greedy,
            record_split=record_split,
            shared=shared,
            synced=synced,
            **keep,
        )
        for index, row in enumerate(rows):
            length, stopped = first_stop(row, stop_ids, list(args.stop_strings), tokenizer)
            responses.append(row[:length])
            ended.append(stopped)
            if record_split:  # the prompt's states and those of the response tokens fed back
                split_rows.append(states[index][: len(chunk[index]) + length])
    return Responses(
        prompt_ids=[list(p) for p in prompts],
        response_ids=responses,
        ended=ended,
        split_hidden=split_rows if record_split else None,
        caches=caches,
    )


def _generate_chunk(hydra, tokenizer, input_ids, attention_mask, args, *, greedy, record_split, shared, synced):
    """One `generate` call over a left-padded chunk: each row's generated tokens (padding after
    its stop included) and, when recording, each row's split hidden states."""
    config = generation_config(args, tokenizer, greedy)
    config.return_dict_in_generate = True  # the cache it leaves serves record_split_hidden
    criteria = StoppingCriteriaList()
    if args.stop_strings:
        criteria.append(StopOnStrings(args.stop_strings, tokenizer, input_ids.shape[1]))
    with hydra.recording_split() if record_split else nullcontext() as steps:
        out = hydra.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            generation_config=config,
            stopping_criteria=criteria,
            synced_gpus=synced,
            **cache_argument(hydra.model, shared.cache if shared else None),
        )
    rows = out.sequences[:, input_ids.shape[1] :].tolist()
    if not record_split:
        return rows, None
    if shared:
        steps.insert(0, shared.split_hidden)
    prompt_lengths = attention_mask.sum(-1).tolist()
    return rows, record_split_hidden(hydra, steps, out, attention_mask, prompt_lengths, rows)


def _decode_chunk(
    hydra, tokenizer, input_ids, attention_mask, args, *, greedy, record_split, shared, synced, caches=None
):
    """_generate_chunk's result from hydrappo's decode loop (decode.py; never synced). A reward
    branch reads the last token's split state, so the loop then feeds every row's last token once more.
    `caches`: a list that each row's RowCache is appended to (the loop keeps them)."""
    rule = SamplingRule(greedy=greedy, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    decoded = decode(
        hydra,
        input_ids,
        attention_mask,
        max_new_tokens=args.max_new_tokens,
        rule=rule,
        stop_ids=[tokenizer.eos_token_id, *args.stop_token_ids],
        min_new_tokens=args.min_new_tokens,
        stop_strings=list(args.stop_strings),
        tokenizer=tokenizer,
        record_split=record_split,
        feed_last=getattr(hydra, "reward_branch", None) is not None,
        cache=shared.cache if shared else None,
        cached_split=shared.split_hidden if shared else None,
        keep_cache=caches is not None,
    )
    if caches is not None:
        caches.extend(decoded.caches)
    return decoded.tokens, decoded.split_hidden


CHUNK_SAMPLERS = {"generate": _generate_chunk, "decode": _decode_chunk}


@dataclass
class SharedPrefill:
    cache: object  # transformers Cache over all but the last prompt column, one row per chunk row
    split_hidden: torch.Tensor | None  # (rows, P - 1, H) when recording


def shared_prefill(hydra: HydraModel, chunk, input_ids, attention_mask, record_split: bool) -> SharedPrefill | None:
    """The prompts' KV cache (all columns but the last) computed once per distinct prompt of
    a run of identical consecutive rows, then repeated for every row: with G samples per
    prompt, 1/G of the prefill. None when no two consecutive prompts are equal or a prompt
    has one column (nothing to share)."""
    firsts = [i for i in range(len(chunk)) if i == 0 or chunk[i] != chunk[i - 1]]
    if len(firsts) == len(chunk) or input_ids.shape[1] < 2:
        return None
    rows = torch.tensor(firsts + [len(chunk)])
    repeat = torch.repeat_interleave(torch.arange(len(firsts)), rows[1:] - rows[:-1]).to(input_ids.device)
    unique_ids, unique_mask = input_ids[firsts, :-1], attention_mask[firsts, :-1]
    with hydra.recording_split() if record_split else nullcontext() as steps:
        out = hydra.model(
            input_ids=unique_ids,
            attention_mask=unique_mask,
            position_ids=position_ids_from_mask(unique_mask),
            use_cache=True,
            logits_to_keep=1,
        )
    cache = output_cache(out)
    cache.batch_select_indices(repeat)
    return SharedPrefill(cache=cache, split_hidden=steps[0][repeat] if record_split else None)


def carried_prefill(
    chunk, carried, input_ids, attention_mask, max_new_tokens: int, record_split: bool
) -> SharedPrefill | None:
    """A KV cache (and recorded states) over the first columns of a left-padded chunk, built from
    each row's carried cache (RowCache: what its previous turn fed), so the decode loop feeds
    only what follows: the previous reply's last token and the tool turn. The loop starts at one
    column for every row, so the row with the most new tokens sets it and the others feed a few
    cached tokens again (recomputed, the same numbers); a row without a usable cache has its
    whole context fed. Positions come from the attention mask, so a row's cached keys (rotated
    at their positions) sit at any column. None when no row has a usable cache (the first turn)."""
    rows, width = input_ids.shape
    usable = [_reusable(cache, row, record_split) for cache, row in zip(carried, chunk)]
    start = width - max(len(row) - n for row, n in zip(chunk, usable))
    if start <= 0:
        return None
    example = next(cache for cache, n in zip(carried, usable) if n)
    capacity = width + max_new_tokens  # the decode loop's own room (decode.with_room)
    layers = []
    for depth in range(len(example.keys)):
        buffers = []
        for name in ("keys", "values"):
            like = getattr(example, name)[depth]
            buffer = like.new_empty(rows, like.shape[0], capacity, like.shape[-1])
            buffer[:, :, :start].zero_()  # padding, masked, but finite (0 x NaN would poison attention)
            for index, (cache, row) in enumerate(zip(carried, chunk)):
                pad = width - len(row)
                if start > pad:  # this row's tokens in the cached columns: all carried (start - pad <= its usable)
                    buffer[index, :, pad:start] = getattr(cache, name)[depth][:, : start - pad]
            buffers.append(buffer)
        layers.append(PreallocatedLayer.holding(*buffers, start))
    cache = DynamicCache()
    cache.layers, cache.layer_class_to_replicate = layers, None  # every layer given: none made lazily
    split = None
    if record_split:
        split = example.split.new_zeros(rows, start, example.split.shape[-1])
        for index, (carried_row, row) in enumerate(zip(carried, chunk)):
            pad = width - len(row)
            if start > pad:
                split[index, pad:start] = carried_row.split[: start - pad]
    return SharedPrefill(cache=cache, split_hidden=split)


def _reusable(cache: RowCache | None, row: list[int], record_split: bool) -> int:
    """How many of the row's first tokens its carried cache covers: the tokens both start with,
    at most all but the last (the loop must feed a token to sample the next), none without the
    recorded states when recording."""
    if cache is None or (record_split and cache.split is None):
        return 0
    limit = min(len(cache.ids), len(row) - 1)
    common = 0
    while common < limit and cache.ids[common] == row[common]:
        common += 1
    return common


def record_split_hidden(hydra: HydraModel, steps, out, prompt_mask, prompt_lengths, rows) -> list[torch.Tensor]:
    """Each row's split hidden states (prompt and response tokens, H) from the decoder passes
    of one `generate` call (`steps`: the left-padded prompts, then one token per row per
    step). The last sampled token was never fed back. Only a reward branch reads its state
    (the score at the last token, or the mean over the response); the policy's outputs at
    that position predict padding and are masked. So with a reward branch attached, and a
    row that needs it, one more bottom-only pass over the cache generate left computes it;
    otherwise such a row's last state is left out (packed as zeros)."""
    recorded = torch.cat(steps, dim=1)  # (B, P + generated - 1, H)
    width, generated = prompt_mask.shape[1], out.sequences.shape[1] - prompt_mask.shape[1]
    if generated and hydra.reward_branch is not None and any(len(row) == generated for row in rows):
        mask = torch.cat([prompt_mask, torch.ones_like(out.sequences[:, width:])], dim=1)
        last = hydra.split_of_next_token(out.sequences[:, -1:], mask, output_cache(out))
        recorded = torch.cat([recorded, last], dim=1)
    return [
        recorded[i, width - length : width + len(row)].clone()
        for i, (length, row) in enumerate(zip(prompt_lengths, rows))
    ]
