"""hydrappo's own decode loop: a prompt's KV cache, then one token per running row per step.

transformers' `generate` is the reference (`generation.sampler: generate`); this loop draws from
the same distribution with less work per token, which is what the CPU profile blamed
(docs/sampling.md has the measurements, tools/lab/bench_sampling.py repeats them):

- One uniform number per row and an inverse-CDF lookup (`sample_from_probs`), where
  `torch.multinomial` draws an exponential number for every vocabulary entry: 33 ms a step
  for 32 rows of a 49k vocabulary on this project's CPU, a sixth of the step.
- Rows that ended leave the batch: their rows of the KV cache are dropped once a quarter of the
  batch is done (dropping copies the cache, so not after every row), instead of decoding
  padding to the longest row as `generate` does.
- The KV cache grows in place (`PreallocatedLayer`): a step writes its position into buffers
  sized for the whole response, where transformers' DynamicLayer concatenates, copying the
  whole cache of every layer at every step (quadratic in the length).
- No per-step logits-processor and stopping-criteria objects: the few rules of
  `responses.generation_config` (temperature, top-k, top-p, EOS and stop ids, min_new_tokens) are
  applied here directly, in `generate`'s order and with its formulas.

The tokens are drawn from the distribution `generate` draws from, with other random numbers;
greedy decoding gives `generate`'s tokens exactly (tests/generation/test_decode.py). Old log-probs never
come from here: PPO's experience pass computes them.
"""

from __future__ import annotations

import inspect
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from ..model import HydraModel
from ..model.arch import cache_argument, output_cache
from ..model.split import position_ids_from_mask

# Ended rows leave the batch once they are this share of it (each removal copies the KV cache).
COMPACT_SHARE = 0.25


@dataclass(frozen=True)
class SamplingRule:
    """How the next token is picked from the last position's logits (greedy: argmax)."""

    greedy: bool = False
    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off


def filtered_logits(logits: torch.Tensor, rule: SamplingRule) -> torch.Tensor:
    """Temperature, then top-k, then top-p (Holtzman et al. 2020), as transformers' logits
    warpers compute them (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper with
    min_tokens_to_keep=1): removed entries become -inf. (B, V) -> (B, V)."""
    logits = logits / rule.temperature
    if rule.top_k > 0:
        kth = torch.topk(logits, min(rule.top_k, logits.shape[-1])).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if rule.top_p < 1.0:
        ascending, order = torch.sort(logits, descending=False)
        cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= (1 - rule.top_p)
        remove[..., -1:] = False  # the most likely token always stays
        logits = logits.masked_fill(remove.scatter(-1, order, remove), float("-inf"))
    return logits


def sample_from_probs(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: for each row the first index whose cumulative probability exceeds
    uniform x total (the total absorbs the rounding of the sum). A zero-probability entry is
    never picked: its cumulative value equals its predecessor's. probs (B, V) >= 0,
    uniforms (B,) in [0, 1) -> (B,) indices."""
    cumulative = probs.cumsum(dim=-1)
    targets = (uniforms * cumulative[:, -1]).unsqueeze(-1)
    picked = torch.searchsorted(cumulative, targets, right=True).squeeze(-1)
    # uniform x total can round up to the total itself; then take the last entry that has mass.
    last_with_mass = probs.shape[-1] - 1 - (probs.flip(-1) > 0).to(torch.int8).argmax(-1)
    return torch.minimum(picked, last_with_mass)


def next_tokens(logits: torch.Tensor, rule: SamplingRule) -> torch.Tensor:
    """(B, V) float32 logits -> (B,) tokens: the argmax, or a draw of the filtered distribution
    with torch's global generator (so a seeded run samples the same tokens again)."""
    if rule.greedy:
        return logits.argmax(dim=-1)
    probs = filtered_logits(logits, rule).softmax(dim=-1)
    return sample_from_probs(probs, torch.rand(probs.shape[0], device=probs.device, dtype=probs.dtype))


class PreallocatedLayer(DynamicLayer):
    """A DynamicLayer whose keys and values live in buffers with room for `capacity` positions:
    `update` writes the new positions in place and returns views of the filled part (attention
    reads strided views as they are), instead of concatenating a new tensor every step. It
    grows (doubling) if asked for more. Everything else of DynamicLayer reads `keys`/`values`,
    which stay views of the buffers."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity, self.length = capacity, 0

    def lazy_initialization(self, key_states, value_states) -> None:
        super().lazy_initialization(key_states, value_states)
        self._buffers = [
            states.new_empty(*states.shape[:2], self.capacity, states.shape[-1])
            for states in (key_states, value_states)
        ]

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self._buffers[0].shape[-2]:
            grown = max(end, 2 * self._buffers[0].shape[-2])
            self._buffers = [
                torch.cat([b, b.new_empty(*b.shape[:2], grown - b.shape[-2], b.shape[-1])], dim=-2)
                for b in self._buffers
            ]
        for buffer, states in zip(self._buffers, (key_states, value_states)):
            buffer[:, :, self.length : end] = states
        self.length = end
        self._expose()
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self._buffers = [buffer[indices] for buffer in self._buffers]
            self._expose()

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            self._buffers = [buffer.repeat_interleave(repeats, dim=0) for buffer in self._buffers]
            self._expose()

    def crop(self, tokens_to_remove: int) -> None:
        super().crop(tokens_to_remove)
        if self.is_initialized:
            self.length = self.keys.shape[-2]

    def _expose(self) -> None:
        self.keys, self.values = (buffer[:, :, : self.length] for buffer in self._buffers)

    @classmethod
    def holding(cls, keys: torch.Tensor, values: torch.Tensor, length: int) -> PreallocatedLayer:
        """A layer over buffers already filled up to `length` (responses.carried_prefill builds
        them), without copying them again: (B, heads, capacity, head_dim) each."""
        layer = cls(keys.shape[-2])
        DynamicLayer.lazy_initialization(layer, keys, values)  # device and dtype, as a first update sets them
        layer._buffers, layer.length = [keys, values], length
        layer._expose()
        return layer


def with_room(cache, model, capacity: int):
    """A cache whose full-attention layers grow in place up to `capacity` positions: a new
    DynamicCache for `model` (cache None), or `cache` with its filled DynamicLayers copied
    into PreallocatedLayers. Sliding-window layers keep their own kind (they stay short)."""
    cache = DynamicCache(config=model.config) if cache is None else cache
    for index, layer in enumerate(cache.layers):
        if type(layer) is DynamicLayer:
            room = PreallocatedLayer(capacity)
            if layer.is_initialized and layer.keys is not None and layer.keys.numel():
                room.update(layer.keys, layer.values)
            cache.layers[index] = room
    return cache


@dataclass
class Decoded:
    tokens: list[list[int]]  # per row: the sampled tokens, up to and including its stop
    ended: list[bool]  # stopped by a stop id or a stop string (not by the length limit)
    # Per row, when recording: the split states of its prompt tokens and of every response token
    # fed back (all but the last, unless feed_last), (L_p + L_r [- 1], H).
    split_hidden: list[torch.Tensor] | None = None
    # Per row, when asked (keep_cache): its KV cache for a next turn to extend.
    caches: list[RowCache | None] | None = None


@dataclass
class RowCache:
    """One row's KV cache over its real tokens (no padding), kept after a turn so that the
    episode's next turn extends it (responses.carried_prefill) instead of prefilling again."""

    ids: list[int]  # the tokens it covers, the row's first real token on
    keys: list[torch.Tensor]  # per layer (heads, len(ids), head_dim)
    values: list[torch.Tensor]
    split: torch.Tensor | None  # (len(ids), H): the split states recorded for them, when recording


@torch.no_grad()
def decode(
    hydra: HydraModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    rule: SamplingRule,
    stop_ids: list[int],
    min_new_tokens: int = 0,
    stop_strings=(),
    tokenizer=None,
    record_split: bool = False,
    feed_last: bool = False,
    cache=None,
    cached_split: torch.Tensor | None = None,
    keep_cache: bool = False,
) -> Decoded:
    """Sample up to `max_new_tokens` tokens after each left-padded prompt row.

    `stop_ids` end a row (transformers' eos_token_id list); before `min_new_tokens` they are
    suppressed. `stop_strings` (with `tokenizer`) end a row once its decoded tokens contain one.
    `record_split`: keep the frozen bottom's output for every token fed to the model.
    `feed_last`: also feed each row's last token once (one more step for the rows at the limit),
    so its split state is recorded too (a reward branch reads it). `cache`, `cached_split`: a KV
    cache (and its recorded states) over the first prompt columns of every row (responses.py's shared
    prefill, or a carried one): the loop starts after them. `keep_cache`: also return each row's
    KV cache over its tokens (RowCache), taken as the row leaves the batch, so that an episode's
    next turn extends it instead of prefilling its context again."""
    # A plain transformers model samples too (`hydrappo compare` of a model folder); only a hydra records.
    model, device = (hydra.model if isinstance(hydra, HydraModel) else hydra), input_ids.device
    # Only the last position's logits are needed (models without the argument return them all).
    last_logits = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    rows, width = input_ids.shape
    stops = torch.tensor(sorted(set(stop_ids)), device=device)
    tokens = torch.zeros(rows, max(max_new_tokens, 1), dtype=torch.long, device=device)
    lengths = torch.zeros(rows, dtype=torch.long, device=device)
    running = torch.ones(rows, dtype=torch.bool, device=device)
    ended = torch.zeros(rows, dtype=torch.bool, device=device)
    batch = torch.arange(rows, device=device)  # the row of the prompt table at each row of the batch
    states = None  # (rows, width + max_new_tokens, H) when recording, made at the first pass
    start = 0 if cache is None else cache.get_seq_length()
    cache = with_room(cache, model, width + max_new_tokens)
    step_ids, mask = input_ids[:, start:], attention_mask
    positions = position_ids_from_mask(attention_mask)[:, start:]
    column = start  # where the states of this step's tokens go
    kept = [None] * rows if keep_cache else None
    for step in range(max_new_tokens + 1):
        with hydra.recording_split() if record_split else nullcontext() as recorded:
            out = model(
                input_ids=step_ids,
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                **last_logits,
                **cache_argument(model, cache),
            )
        cache = output_cache(out)
        if record_split:
            if states is None:
                states = recorded[0].new_zeros(rows, width + max_new_tokens, recorded[0].shape[-1])
                if cached_split is not None:
                    states[:, :start] = cached_split
            states[batch, column : column + step_ids.shape[1]] = recorded[0]
        column += step_ids.shape[1]
        if step == max_new_tokens:  # the pass that only fed the last tokens (feed_last)
            break
        logits = out.logits[:, -1].float()
        if step < min_new_tokens:
            logits[:, stops] = float("-inf")
        picked = next_tokens(logits, rule)
        live = running[batch]
        rows_now = batch[live]
        tokens[rows_now, step] = picked[live]
        lengths[rows_now] += 1
        stopped = torch.isin(picked, stops) & live
        if stop_strings:
            stopped |= _has_stop_string(tokens, lengths, batch, live, stop_strings, tokenizer)
        ended[batch[stopped]] = True
        running[batch[stopped]] = False
        at_limit = step + 1 == max_new_tokens
        # A row still needs the model while it runs, and (feed_last) for one step after its last token.
        needed = running[batch] & (not at_limit)
        if feed_last:
            needed |= stopped | (live & at_limit)
        if not bool(needed.any()):
            break
        done = int((~needed).sum())
        if done and done >= COMPACT_SHARE * len(batch):
            keep = needed.nonzero().squeeze(-1)
            if keep_cache:  # the leaving rows' caches, before their rows are dropped
                leaving = (~needed).nonzero().squeeze(-1)
                keep_rows(kept, cache, leaving, batch, input_ids, attention_mask, tokens, lengths, states, column)
            cache.batch_select_indices(keep)
            batch, picked, mask = batch[keep], picked[keep], mask[keep]
        step_ids = picked.unsqueeze(-1)
        positions = mask.sum(-1, keepdim=True)  # the new token's position: the count of real tokens before it
        mask = torch.cat([mask, mask.new_ones(len(batch), 1)], dim=-1)
    if keep_cache:
        every = torch.arange(len(batch), device=device)
        keep_rows(kept, cache, every, batch, input_ids, attention_mask, tokens, lengths, states, column)
    tokens_out = [tokens[i, : int(lengths[i])].tolist() for i in range(rows)]
    split = None
    if record_split:
        fed = lengths if feed_last else (lengths - 1).clamp(min=0)
        real = attention_mask.sum(-1)
        split = [states[i, width - int(real[i]) : width + int(fed[i])].clone() for i in range(rows)]
    return Decoded(tokens=tokens_out, ended=ended.tolist(), split_hidden=split, caches=kept)


def keep_rows(kept: list, cache, leaving, batch, input_ids, attention_mask, tokens, lengths, states, column) -> None:
    """kept[row] for the batch rows `leaving`: the KV cache (and recorded states) over the row's
    real tokens so far, its prompt's and the sampled tokens fed back (`column - width` steps fed;
    the left padding, and what a row that ended was fed after its stop, left out). Nothing when a
    layer is not a full-attention PreallocatedLayer (a sliding window keeps only its last
    positions): that row's next turn then prefills its context again."""
    if not all(type(layer) is PreallocatedLayer and layer.is_initialized for layer in cache.layers):
        return
    width = input_ids.shape[1]
    for index in leaving.tolist():
        row = int(batch[index])
        real, fed = int(attention_mask[row].sum()), min(column - width, int(lengths[row]))
        columns = slice(width - real, width + fed)
        kept[row] = RowCache(
            ids=input_ids[row, width - real :].tolist() + tokens[row, :fed].tolist(),
            keys=[layer.keys[index, :, columns].clone() for layer in cache.layers],
            values=[layer.values[index, :, columns].clone() for layer in cache.layers],
            split=states[row, columns].clone() if states is not None else None,
        )


def _has_stop_string(tokens, lengths, batch, live, stop_strings, tokenizer) -> torch.Tensor:
    """(batch rows,) whether a live row's tokens so far contain a stop string."""
    found = torch.zeros(len(batch), dtype=torch.bool, device=tokens.device)
    for index in live.nonzero().squeeze(-1).tolist():
        row = int(batch[index])
        text = tokenizer.decode(tokens[row, : int(lengths[row])].tolist(), skip_special_tokens=False)
        found[index] = any(stop in text for stop in stop_strings)
    return found
