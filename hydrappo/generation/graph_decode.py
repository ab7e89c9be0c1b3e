"""A decode step with fixed shapes and no host sync, so that CUDA can replay it as a graph
(`generation.sampler: graph`).

On a GPU the decode loop (decode.py) and generate spend their time launching kernels and running
Python, not reading weights: a bf16 step of a 1.7B model reads its 3.4 GB of weights in about
1.1 ms on an H100 and took 25 ms with generate there; it launches hundreds of small kernels, and
the loop waits for the device at every token (which rows ended).
Here every piece of state a token step touches lives in a buffer allocated once per bucket:

- a static KV cache (transformers' StaticLayer for every layer, sliding-window ones too: the
  model's own masks apply the window to absolute positions) with room for prompt + response,
- the attention mask, positions, the step counter, the sampled tokens, the response lengths,
  which rows still run, and the recorded split states,

and one step (`StaticDecoder.step`) is pure tensor work on them: the hydra's forward over the
last token of every row, min_new_tokens' suppression, temperature / top-k / top-p and the draw
(decode.py's functions), the stop ids and the length limit, and the split state written at its
column. On CUDA it is captured once per bucket with torch.cuda.CUDAGraph and replayed; the host
looks at the device only every SYNC_EVERY steps (have all rows ended?), and stop strings are
checked then, on the tokens so far (stops.first_stop trims every row at its first stop
anyway). Rows that ended keep their place in the batch and feed padding, as generate's do.

Buckets: the rows of a chunk are padded up to a power of two and the cache's length up to a
multiple of LENGTH_STEP; one bucket lives at a time (GraphDecoding), and a chunk that fits it
runs in it, so a run captures a few graphs (the first chunk's, a larger one's, evaluation's
greedy rule) and replays them. The prefill runs eagerly, into the bucket's cache.

A captured graph reads the buffers it was captured on. The trainer updates the policy's weights
in place (torch.optim, bitsandbytes' 8-bit optimizers and peft's adapters all do), so the next
replay reads the new weights (under mixed precision the step runs with autocast's weight cache
off, so the casts of the float32 trained layers are kernels of the graph: without_autocast_cache);
anything that gives a parameter or buffer new storage (loading a checkpoint into new tensors, a
dtype or device change) changes `weights_fingerprint`, and the bucket and its graph are dropped
and captured again before the next sample.

On a CPU the same step runs eagerly: that is what the tests compare with the decode loop.
"""

from __future__ import annotations

import inspect
import warnings
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, DynamicCache, StaticLayer

from ..model import HydraModel
from ..model.arch import cache_argument
from ..model.split import position_ids_from_mask
from .decode import SamplingRule, next_tokens

LENGTH_STEP = 64  # the cache's length is rounded up to a multiple of this (one graph per length bucket)
SYNC_EVERY = 8  # token steps between two looks of the host at the device (have all rows ended?)


def bucket_of(rows: int, length: int) -> tuple[int, int]:
    """The bucket a chunk of `rows` rows needing `length` cache positions runs in: rows up to a
    power of two, length up to a multiple of LENGTH_STEP."""
    return 1 << max(rows - 1, 0).bit_length(), -(-length // LENGTH_STEP) * LENGTH_STEP


def weights_fingerprint(module: torch.nn.Module) -> tuple:
    """What a captured graph depends on: every parameter's and buffer's identity, storage,
    dtype and shape. In-place updates (optimizer steps) keep it; new storage changes it."""
    tensors = [*module.parameters(), *module.buffers()]
    return tuple((id(t), t.data_ptr(), t.dtype, t.device, tuple(t.shape)) for t in tensors)


def without_autocast_cache(device_type: str):
    """Autocast as it is around the call, but without its weight cache. Under mixed precision
    the trained layers are float32 and autocast casts them to bf16 once per autocast region,
    keeping the copy until the region ends: a graph captured with the cache would read that
    copy, freed when the sample ends and stale after the next optimizer step (it did on an
    H100: the second rollout sampled from garbage). Without the cache the cast is a kernel of
    the graph, reading the float32 weights the optimizer updates in place."""
    if not torch.is_autocast_enabled(device_type):
        return nullcontext()
    return torch.autocast(device_type, dtype=torch.get_autocast_dtype(device_type), cache_enabled=False)


def _layer_count(model) -> int:
    cache = DynamicCache(config=model.config)
    return len(cache.layers) or model.config.get_text_config().num_hidden_layers


class StaticDecoder:
    """The buffers of one bucket (rows x capacity, one sampling rule) and its token step."""

    def __init__(
        self,
        hydra,
        rows: int,
        capacity: int,
        max_new_tokens: int,
        rule: SamplingRule,
        stop_ids: list[int],
        min_new_tokens: int,
        pad_id: int,
    ):
        self.hydra = hydra
        self.model = hydra.model if isinstance(hydra, HydraModel) else hydra
        self.rows, self.capacity, self.max_new_tokens, self.rule = rows, capacity, max_new_tokens, rule
        self.min_new_tokens = min_new_tokens
        device = self.model.device
        self.cache = Cache(layers=[StaticLayer(capacity) for _ in range(_layer_count(self.model))])
        self.last_logits = (
            {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(self.model.forward).parameters else {}
        )
        vocab = self.model.get_output_embeddings().weight.shape[0]
        self.stops = torch.tensor(sorted(set(stop_ids)), device=device)
        self.stop_vocab = torch.zeros(vocab, dtype=torch.bool, device=device)
        self.stop_vocab[self.stops] = True
        self.pad = torch.tensor(pad_id, device=device)
        long = dict(dtype=torch.long, device=device)
        self.tokens = torch.zeros(rows, max_new_tokens + 1, **long)  # one column more: the feed-only step
        self.lengths = torch.zeros(rows, **long)
        self.running = torch.zeros(rows, dtype=torch.bool, device=device)
        self.ended = torch.zeros(rows, dtype=torch.bool, device=device)
        self.mask = torch.zeros(rows, capacity, **long)
        self.current = torch.zeros(rows, 1, **long)  # the token each row feeds next
        self.positions = torch.zeros(rows, 1, **long)
        self.column = torch.zeros(1, **long)  # the cache column of the token fed next
        self.step_index = torch.zeros((), **long)  # the step whose token is sampled next
        self.states: torch.Tensor | None = None  # (rows, capacity, H), made by the first recording prefill
        self.graph = None
        self.fingerprint = None

    # --- the prefill (eager) -------------------------------------------------------------
    def prefill(self, input_ids, attention_mask, record_split: bool, cache=None, cached_split=None) -> None:
        """Reset the buffers for a new chunk (rows already padded to the bucket), fill the cache with
        the prompts (after the first columns a shared `cache` holds) and sample each row's first token."""
        width = input_ids.shape[1]
        start = 0 if cache is None else cache.get_seq_length()
        for layer in self.cache.layers:
            if layer.is_initialized:
                layer.cumulative_length.zero_()
        if cache is not None:
            for mine, theirs in zip(self.cache.layers, cache.layers):
                keys, values = theirs.keys, theirs.values  # a sliding-window layer keeps only the last columns
                if not mine.is_initialized:
                    mine.lazy_initialization(keys, values)
                mine.keys[:, :, start - keys.shape[-2] : start] = keys
                mine.values[:, :, start - keys.shape[-2] : start] = values
                mine.cumulative_length.fill_(start)
        self.mask.zero_()
        self.mask[:, :width] = attention_mask
        positions = position_ids_from_mask(attention_mask)
        with self.hydra.recording_split() if record_split else nullcontext() as recorded:
            out = self.model(
                input_ids=input_ids[:, start:],
                attention_mask=self.mask,
                position_ids=positions[:, start:],
                use_cache=True,
                **self.last_logits,
                **cache_argument(self.model, self.cache),
            )
        if record_split:
            if self.states is None:
                self.states = recorded[0].new_zeros(self.rows, self.capacity, recorded[0].shape[-1])
            if cached_split is not None:
                self.states[:, :start] = cached_split
            self.states[:, start:width] = recorded[0]
        self.tokens.zero_()
        self.lengths.zero_()
        self.running.fill_(True)
        self.ended.zero_()
        self.step_index.zero_()
        self.positions.copy_(attention_mask.sum(-1, keepdim=True))
        self.column.fill_(width)
        self._pick(out.logits[:, -1].float())

    # --- one token step (the part a CUDA graph replays) ----------------------------------
    def step(self, record_split: bool) -> None:
        """Feed each row's last token at `column`, then sample the next one. Only tensor work on
        the buffers: no Python branch reads a device value."""
        self.mask.index_fill_(1, self.column, 1)
        with (
            without_autocast_cache(self.mask.device.type),
            self.hydra.recording_split() if record_split else nullcontext() as recorded,
        ):
            out = self.model(
                input_ids=self.current,
                attention_mask=self.mask,
                position_ids=self.positions,
                use_cache=True,
                **self.last_logits,
                **cache_argument(self.model, self.cache),
            )
        if record_split:
            self.states.index_copy_(1, self.column, recorded[0])
        self.positions.add_(1)
        self.column.add_(1)
        self._pick(out.logits[:, -1].float())

    def _pick(self, logits: torch.Tensor) -> None:
        """Sample the token of step `step_index` for every row and update which rows run."""
        early = self.step_index < self.min_new_tokens  # before min_new_tokens, stop ids are suppressed
        logits = logits.masked_fill(self.stop_vocab & early, float("-inf"))
        picked = torch.where(self.running, next_tokens(logits, self.rule), self.pad)
        self.tokens.index_copy_(1, self.step_index.view(1), picked.unsqueeze(-1))
        self.lengths.add_(self.running.long())
        stopped = torch.isin(picked, self.stops) & self.running
        self.ended.logical_or_(stopped)
        self.running.logical_and_(~stopped)
        self.running.logical_and_(self.step_index + 1 < self.max_new_tokens)
        self.current.copy_(picked.unsqueeze(-1))
        self.step_index.add_(1)

    # --- replay -------------------------------------------------------------------------
    def run_step(self, record_split: bool) -> None:
        """One token step: the captured graph on CUDA (the first call runs the step eagerly, as the
        warm-up capturing needs, then captures it), the eager step elsewhere."""
        if self.model.device.type != "cuda" or self.graph is False:
            self.step(record_split)
            return
        if self.graph is None:
            self._warm_and_capture(record_split)
            return
        self.graph.replay()

    def _warm_and_capture(self, record_split: bool) -> None:
        """The first step runs eagerly on a side stream (the warm-up CUDA graphs need: cuBLAS
        handles, workspace), then the step is captured (capturing runs nothing)."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self.step(record_split)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                self.step(record_split)
        except Exception as error:  # a module that syncs with the host (some quantized kernels) cannot be captured
            warnings.warn(
                f"the decode step could not be captured as a CUDA graph ({error}); it runs eagerly", stacklevel=2
            )
            self.graph = False
            return
        self.graph = graph

    def finished(self, stop_strings, tokenizer) -> bool:
        """Whether no row runs any more (a host sync). Rows whose tokens so far hold a stop
        string stop here."""
        if stop_strings:
            lengths, running = self.lengths.tolist(), self.running.tolist()
            for row in (i for i, run in enumerate(running) if run):
                text = tokenizer.decode(self.tokens[row, : lengths[row]].tolist(), skip_special_tokens=False)
                if any(stop in text for stop in stop_strings):
                    self.running[row] = False
                    self.ended[row] = True
        return not bool(self.running.any())


@dataclass(frozen=True)
class _Kind:
    """What a graph bakes in besides its shapes."""

    max_new_tokens: int
    rule: SamplingRule
    min_new_tokens: int
    stop_ids: tuple[int, ...]
    pad_id: int


class GraphDecoding:
    """One hydra's live bucket (a StaticDecoder), kept across calls, and the chunk function
    responses.generate_responses runs through it.

    One bucket at a time, so the memory the static cache holds between samples is one KV cache
    of the largest bucket (the planner counts it): a chunk that fits the live bucket (as many
    rows or fewer, as long or shorter) runs in it; a larger one replaces it by a bucket large
    enough for both, and another sampling rule (greedy evaluation) by one of its own."""

    def __init__(self, hydra, capture: bool = True):
        self.hydra, self.capture = hydra, capture  # capture False: the step runs eagerly on CUDA too
        self.model = hydra.model if isinstance(hydra, HydraModel) else hydra
        self.live: StaticDecoder | None = None
        self.kind: _Kind | None = None
        self.fingerprint = None

    def check_weights(self) -> bool:
        """Drop the live bucket (graph and buffers) if a parameter or buffer got new storage
        since it was made; True if one did."""
        now = weights_fingerprint(self.hydra)
        changed = self.fingerprint is not None and now != self.fingerprint
        if changed:
            self.live = None
        self.fingerprint = now
        return changed

    def decoder(self, kind: _Kind, rows: int, length: int) -> StaticDecoder:
        live = self.live
        if live is not None and kind == self.kind and rows <= live.rows and length <= live.capacity:
            return live
        if live is not None and kind == self.kind:
            rows, length = max(rows, live.rows), max(length, live.capacity)
        rows, capacity = bucket_of(rows, length)
        self.live = None  # free the old buffers and graph before the new ones are allocated
        self.live = StaticDecoder(
            self.hydra,
            rows,
            capacity,
            kind.max_new_tokens,
            kind.rule,
            list(kind.stop_ids),
            kind.min_new_tokens,
            kind.pad_id,
        )
        if not self.capture:
            self.live.graph = False
        self.kind = kind
        return self.live

    @torch.no_grad()
    def chunk(self, hydra, tokenizer, input_ids, attention_mask, args, *, greedy, record_split, shared, synced):
        """generate_responses' chunk sampler: each row's tokens (up to its stop or the limit; padding never)
        and, when recording, each row's split states (prompt, then every response token fed back;
        the last one too when a reward branch is attached)."""
        if synced:
            raise ValueError("the graph sampler cannot run a trunk sharded over processes; use sampler: generate")
        rows, width = input_ids.shape
        feed_last = getattr(hydra, "reward_branch", None) is not None
        rule = SamplingRule(greedy=greedy, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
        stop_ids = tuple(sorted({tokenizer.eos_token_id, *args.stop_token_ids}))
        kind = _Kind(args.max_new_tokens, rule, args.min_new_tokens, stop_ids, tokenizer.pad_token_id)
        decoder = self.decoder(kind, rows, width + args.max_new_tokens)
        bucket_rows = decoder.rows
        # Rows beyond the chunk's repeat its last row; their tokens are dropped.
        index = torch.arange(bucket_rows, device=input_ids.device).clamp(max=rows - 1)
        cache = shared.cache if shared else None
        if cache is not None and bucket_rows != rows:
            cache.batch_select_indices(index)
        cached_split = shared.split_hidden[index] if shared and shared.split_hidden is not None else None
        decoder.prefill(input_ids[index], attention_mask[index], record_split, cache, cached_split)
        # Steps 1 .. max_new_tokens - 1 sample; one more only feeds the last tokens (feed_last).
        for step in range(1, args.max_new_tokens + int(feed_last)):
            if (step - 1) % SYNC_EVERY == 0 and decoder.finished(args.stop_strings, tokenizer):
                if feed_last:
                    decoder.run_step(record_split)
                break
            decoder.run_step(record_split)
        decoder.finished(args.stop_strings, tokenizer)
        lengths = decoder.lengths[:rows].tolist()
        tokens = [decoder.tokens[i, : lengths[i]].tolist() for i in range(rows)]
        if not record_split:
            return tokens, None
        fed = [n if feed_last else max(n - 1, 0) for n in lengths]
        real = attention_mask.sum(-1).tolist()
        return tokens, [decoder.states[i, width - real[i] : width + fed[i]].clone() for i in range(rows)]
