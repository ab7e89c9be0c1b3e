"""Generation and experience making: prompts in, a batch of PPO experience out (the samplers
that call this module's generation are in sampling.py).

Masks come from positions, never from comparing token ids with the pad id: with
SmolLM2 (and many chat models) the pad token IS the EOS token, so a real EOS and the
padding after it carry the same id.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, fields

import torch
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

from .config import GenerationArgs
from .data import left_pad
from .decode import SamplingRule, decode
from .model import HydraModel, HydraOutput
from .model.arch import cache_argument, output_cache
from .model.heads import widened
from .model.split import position_ids_from_mask


@dataclass
class Responses:
    """Sampled responses of one batch, trimmed at their first stop."""

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]  # each includes its stop token (EOS or stop id), if any
    ended: list[bool]  # stopped by EOS, a stop token id or a stop string (not by length)
    # Per row, the frozen bottom's output for its prompt and response tokens (L_p + L_r, H),
    # recorded while sampling (generate_responses(record_split=True)); else None.
    split_hidden: list[torch.Tensor] | None = None


@dataclass
class Rollout:
    """One process's rows of a PPO batch before scoring: its prompts, the responses sampled for
    them, the packed sequences and the hydra's pass over them (evaluate_sequences)."""

    indices: list[int]  # rows of the prompt table, each G times in consecutive rows
    prompt_texts: list[str]
    responses: Responses
    response_texts: list[str]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    action_mask: torch.Tensor
    prompt_width: int
    evaluation: object  # evaluate_sequences' output


@dataclass
class Experience:
    """One PPO batch. Sequences are prompt (left-padded to width P) + response
    (right-padded to width R). Per-token tensors are response-aligned, (B, R)."""

    input_ids: torch.Tensor  # (B, P + R)
    attention_mask: torch.Tensor  # (B, P + R)
    action_mask: torch.Tensor  # (B, R), float: 1 on response tokens
    split_hidden: torch.Tensor | None  # (B, P + R, H), the frozen trunk's output
    logprobs: torch.Tensor  # (B, R) under the sampling policy
    ref_logprobs: torch.Tensor | None  # (B, R); None when the reference was not run
    values: torch.Tensor | None  # (B, R); None without a critic
    rewards: torch.Tensor  # (B, R) shaped rewards
    advantages: torch.Tensor  # (B, R)
    returns: torch.Tensor | None  # (B, R) value targets; None without a critic
    prompt_width: int
    # The whole batch this process holds a share of, for minibatches(): every row's weight in the
    # loss's count (algo.losses.aggregation_weights), over the rows of ALL processes in rank order,
    # and the index of this process's first row among them. Minibatches carry neither.
    batch_weights: torch.Tensor | None = None
    first_row: int = 0

    def minibatch(self, index: torch.Tensor) -> Experience:
        """The rows `index` of this process's rows."""
        parts = {}
        for f in fields(self):
            value = getattr(self, f.name)
            parts[f.name] = value[index] if isinstance(value, torch.Tensor) and f.name != "batch_weights" else value
        parts.update(batch_weights=None, first_row=0)
        return Experience(**parts)

    @property
    def whole_batch_size(self) -> int:
        """Rows of the whole batch, over every process."""
        return len(self.batch_weights)

    def minibatches(self, minibatch_rows: torch.Tensor):
        """One epoch of minibatches (minibatch_plan's rows of the WHOLE batch): for each, this
        process's rows of it and the minibatch's loss denominator, its count of tokens (or rows)
        over every process, so that the losses of its parts, however split, add up to its loss."""
        first, end = self.first_row, self.first_row + len(self)
        for rows in minibatch_rows:
            denominator = float(self.batch_weights[rows].sum().clamp(min=1))
            local = rows[(rows >= first) & (rows < end)] - first
            yield self.minibatch(local.to(self.input_ids.device)), denominator

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def split(self, parts: int):
        """`parts` consecutive micro-batches (gradient accumulation)."""
        size = len(self) // parts
        for start in range(0, len(self), size):
            yield self.minibatch(torch.arange(start, min(start + size, len(self)), device=self.input_ids.device))

    @property
    def logprob_offset(self) -> int:
        """Index in a (B, P+R-1) log-prob row of the first response token's log-prob."""
        return self.prompt_width - 1


def minibatch_plan(batch_size: int, mini_batch_size: int, generator: torch.Generator) -> torch.Tensor:
    """One epoch's minibatches of a batch, (batch_size / mini_batch_size, mini_batch_size): row j
    holds the batch rows of minibatch j. One draw of `generator`.

    Stratified: the batch is cut into mini_batch_size consecutive strata of n = batch_size /
    mini_batch_size rows, and each minibatch takes one row of every stratum (an independent
    shuffle per stratum). Process r of K holds rows [r B/K, (r+1) B/K), which are whole strata,
    so it holds exactly mini_batch_size / K rows of every minibatch (columns r m/K to (r+1) m/K),
    and the minibatches are the same at any number of processes."""
    strata = batch_size // mini_batch_size
    order = torch.rand(mini_batch_size, strata, generator=generator).argsort(-1)
    return (order + strata * torch.arange(mini_batch_size)[:, None]).T.contiguous()


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


class StopOnStrings(StoppingCriteria):
    """Ends a row once its generated text contains a stop string.

    transformers' own `stop_strings` needs a vocabulary it can map to strings token by
    token, which word-level and some SentencePiece tokenizers defeat; decoding the
    generated part works with any tokenizer and agrees exactly with `first_stop`."""

    def __init__(self, stop_strings: list[str], tokenizer, prompt_width: int):
        self.stop_strings = list(stop_strings)
        self.tokenizer = tokenizer
        self.prompt_width = prompt_width

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        texts = self.tokenizer.batch_decode(input_ids[:, self.prompt_width :], skip_special_tokens=False)
        done = [any(stop in text for stop in self.stop_strings) for text in texts]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


def first_stop(tokens: list[int], stop_ids: set[int], stop_strings: list[str], tokenizer) -> tuple[int, bool]:
    """Length of a generated response up to and including its first stop, and whether it stopped.

    A stop token id ends the response at that token; a stop string ends it at the token that
    completes it (as generate does), if that comes first. The stop string is found by a binary
    search over prefix lengths: about log2(R) + 1 decodes of a row of R tokens instead of R
    (decoding every growing prefix cost O(R^2) per row). The search returns the shortest prefix
    whose text contains a stop string because that property only switches on as the prefix
    grows: decoding a longer prefix extends the text of a shorter one. Where a tokenizer's
    decoding is not prefix-stable (a prefix ending inside a multi-byte character decodes to a
    replacement character), the result is still a prefix that ends exactly where a stop string
    is completed.
    """
    stop_at = next((index + 1 for index, token in enumerate(tokens) if token in stop_ids), None)
    # A stop string must be complete before the stop token (the stop token's own text is not searched).
    searchable = len(tokens) if stop_at is None else stop_at - 1
    if stop_strings and searchable > 0:

        def has_stop(length: int) -> bool:
            text = tokenizer.decode(tokens[:length], skip_special_tokens=False)
            return any(stop in text for stop in stop_strings)

        if has_stop(searchable):
            low, high = 1, searchable  # the shortest prefix with a stop string lies in [low, high]
            while low < high:
                middle = (low + high) // 2
                if has_stop(middle):
                    high = middle
                else:
                    low = middle + 1
            return low, True
    if stop_at is not None:
        return stop_at, True
    return len(tokens), False


@torch.no_grad()
def generate_responses(
    hydra: HydraModel, tokenizer, prompts: list[list[int]], args: GenerationArgs, synced: bool = False,
    record_split: bool = False, share: bool | None = None, greedy: bool = False, loop: str = "generate",
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
    transformers model (`hydrappo compare`): it samples, but neither records nor shares."""
    is_hydra = isinstance(hydra, HydraModel)
    share = (args.share_prompt_prefill if share is None else share) and is_hydra and not synced
    sample_chunk = loop if callable(loop) else CHUNK_SAMPLERS[loop]
    stop_ids = {tokenizer.eos_token_id, *args.stop_token_ids}
    responses, ended, split_rows = [], [], []
    for start in range(0, len(prompts), args.generation_batch_size):
        # One chunk per call: its KV cache and recorded steps are freed before the next chunk starts.
        chunk = prompts[start : start + args.generation_batch_size]
        input_ids, attention_mask = (t.to(hydra.device) for t in left_pad(chunk, tokenizer.pad_token_id))
        # G samples of one prompt sit in consecutive rows: run each distinct prompt once (all
        # but its last token) and hand the loop the cache, repeated for its rows.
        shared = shared_prefill(hydra, chunk, input_ids, attention_mask, record_split) if share else None
        rows, states = sample_chunk(hydra, tokenizer, input_ids, attention_mask, args, greedy=greedy,
                                    record_split=record_split, shared=shared, synced=synced)  # fmt: skip
        for index, row in enumerate(rows):
            length, stopped = first_stop(row, stop_ids, list(args.stop_strings), tokenizer)
            responses.append(row[:length])
            ended.append(stopped)
            if record_split:  # the prompt's states and those of the response tokens fed back
                split_rows.append(states[index][: len(chunk[index]) + length])
    return Responses(
        prompt_ids=[list(p) for p in prompts], response_ids=responses, ended=ended,
        split_hidden=split_rows if record_split else None,
    )  # fmt: skip


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
            input_ids=input_ids, attention_mask=attention_mask, generation_config=config,
            stopping_criteria=criteria, synced_gpus=synced, **cache_argument(hydra.model, shared.cache if shared else None),
        )  # fmt: skip
    rows = out.sequences[:, input_ids.shape[1] :].tolist()
    if not record_split:
        return rows, None
    if shared:
        steps.insert(0, shared.split_hidden)
    prompt_lengths = attention_mask.sum(-1).tolist()
    return rows, record_split_hidden(hydra, steps, out, attention_mask, prompt_lengths, rows)


def _decode_chunk(hydra, tokenizer, input_ids, attention_mask, args, *, greedy, record_split, shared, synced):
    """_generate_chunk's result from hydrappo's decode loop (decode.py; never synced). A reward
    branch reads the last token's split state, so the loop then feeds every row's last token once more."""
    rule = SamplingRule(greedy=greedy, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    decoded = decode(
        hydra, input_ids, attention_mask, max_new_tokens=args.max_new_tokens, rule=rule,
        stop_ids=[tokenizer.eos_token_id, *args.stop_token_ids], min_new_tokens=args.min_new_tokens,
        stop_strings=list(args.stop_strings), tokenizer=tokenizer, record_split=record_split,
        feed_last=getattr(hydra, "reward_branch", None) is not None,
        cache=shared.cache if shared else None, cached_split=shared.split_hidden if shared else None,
    )  # fmt: skip
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
        out = hydra.model(input_ids=unique_ids, attention_mask=unique_mask, position_ids=position_ids_from_mask(unique_mask),
                          use_cache=True, logits_to_keep=1)  # fmt: skip
    cache = output_cache(out)
    cache.batch_select_indices(repeat)
    return SharedPrefill(cache=cache, split_hidden=steps[0][repeat] if record_split else None)


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
        recorded[i, width - length : width + len(row)].clone() for i, (length, row) in enumerate(zip(prompt_lengths, rows))
    ]


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


def pack_sequences(prompt_ids: list[list[int]], response_ids: list[list[int]], pad_token_id: int):
    """Prompt left-padded to the widest prompt, response right-padded to the longest
    response. Returns input_ids, attention_mask, action_mask (float) and the prompt width."""
    prompts, prompt_mask = left_pad(prompt_ids, pad_token_id)
    width = max(1, max(len(r) for r in response_ids))
    batch = len(response_ids)
    responses = torch.full((batch, width), pad_token_id, dtype=torch.long)
    action_mask = torch.zeros((batch, width), dtype=torch.float32)
    for row, tokens in enumerate(response_ids):
        responses[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        action_mask[row, : len(tokens)] = 1.0
    input_ids = torch.cat([prompts, responses], dim=1)
    attention_mask = torch.cat([prompt_mask, action_mask.long()], dim=1)
    return input_ids, attention_mask, action_mask, prompts.shape[1]


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
def evaluate_sequences(
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
) -> HydraOutput:
    """forward_hydra over the batch in chunks: response-aligned log-probs, reference
    log-probs, values and entropy, the split hidden state (kept for the PPO epochs), plus
    reward-branch scores when a branch is attached. The prompt's log-probs are never computed,
    and without `with_reference` (a KL coefficient of 0) the reference branch never runs.
    With `split_hidden` (pack_split_hidden of states recorded while sampling) the frozen
    bottom does not run again: only the branches do."""
    device = hydra.device
    names = ("logprobs", "ref_logprobs", "values", "entropy", "split_hidden", "scores")
    parts: dict[str, list] = {name: [] for name in names}
    for start in range(0, input_ids.shape[0], chunk_size):
        ids = input_ids[start : start + chunk_size].to(device)
        mask = attention_mask[start : start + chunk_size].to(device)
        with autocast() if autocast else nullcontext():
            out = hydra.forward_hydra(
                ids, mask, return_entropy=True, return_reference=with_reference, temperature=temperature,
                logprobs_from=prompt_width - 1,
                split_hidden=split_hidden[start : start + chunk_size] if split_hidden is not None else None,
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
