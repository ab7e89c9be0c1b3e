"""Samplers: what turns prompt ids into responses for the trainer.

A sampler takes the prompts (token ids) and the generation options and returns `Responses`:
each row's response trimmed at its first stop, whether it stopped, and, where the sampler
can (`records_split`), the frozen bottom's split states recorded while sampling, so the
experience pass runs only the top branches. Whatever samples, PPO's old log-probs come from
the experience pass (train/sequences.py, experience_pass), never from the sampler: a sampler only has
to draw from the policy's distribution, and its own numerics (paged attention, kernels of a
serving engine) never enter the loss.

    decode               hydrappo's own decode loop (decode.py, through responses.generate_responses):
                         generate's distribution with less work per token (one uniform number per
                         row instead of an exponential draw over the vocabulary, no per-step
                         processor objects) and rows that ended leave the batch; records the split
                         states and shares the prefill as generate does. Not under FSDP.
    graph                the decode loop's step with fixed shapes (graph_decode.py): a static KV cache
                         per bucket of rows x length, every per-token tensor preallocated, the step
                         captured as a CUDA graph and replayed (eager elsewhere); rows that ended stay
                         in the batch. Records the split states and shares the prefill. Not under FSDP.
    generate             transformers' `generate` on the hydra's model (responses.generate_responses):
                         a KV cache per chunk of `generation_batch_size` rows, records the split
                         states, shares the prefill of a prompt's G samples, runs under FSDP.
    continuous_batching  transformers' continuous batching (`generate_batch`): a paged KV cache,
                         rows leave the batch as they end and waiting ones take their place.
                         Records no split states (its batches are packed token lists), so the
                         experience pass runs the whole trunk again.
    vllm                 a serving engine (vLLM) colocated in the process, holding its own copy of
                         the policy: every weight pushed once, then only the trained ones after
                         each update (serving.py). Records no split states. An optional extra.

`generation.sampler: auto` picks per device the one measured fastest there (DEFAULT_SAMPLER;
docs/sampling.md has the numbers and the command that measures them).
"""

from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

import torch
from transformers import GenerationConfig

from ..config import GenerationArgs
from ..model import HydraModel
from .responses import Responses, generate_responses, generation_config
from .stops import first_stop

# The default of `generation.sampler: auto` per device type, as measured (docs/sampling.md).
# CPU (tools/lab/bench_sampling.py): the decode loop is the fastest there; continuous batching is slower
# than generate at every page size tried (SmolLM2-135M, 16 x 32 greedy: 0.83-0.86x generate's
# tokens/s, 32 x 24: 0.68x; a 4-layer toy: 0.11x, its ~0.8 s fixed cost per call), and it records
# no split states, so the experience pass costs more too. CUDA (one H100, bf16, side by side in one
# call; docs/benchmarks.md#speed-on-an-h100): the graph sampler. Sampling 32 x 64 tokens
# at the 1.7B shape took 0.344 s against generate's 1.753 s and the decode loop's 1.484 s
# (transformers' static cache compiled with reduce-overhead: 0.370 s, after a 34 s first call); the
# 135M main job's rollout 0.27 s against generate's 1.30 s. Other devices: generate.
DEFAULT_SAMPLER = {"cpu": "decode", "cuda": "graph"}


@runtime_checkable
class Sampler(Protocol):
    """Prompts in, responses out, from the policy as it is now."""

    name: str
    records_split: bool  # whether sample(record_split=True) returns the split states

    def sample(
        self, prompt_ids: list[list[int]], args: GenerationArgs, *, greedy: bool = False, record_split: bool = False
    ) -> Responses:
        """One response per prompt (rows in the order of `prompt_ids`). `greedy`: the most likely
        token at each step (held-out evaluation). `record_split` (only when `records_split`):
        Responses.split_hidden holds each row's split states."""
        ...

    def weights_changed(self) -> None:
        """The trainer updated the policy. A sampler that reads the hydra's own weights has
        nothing to do; one that holds a copy (serving.py) refreshes it before its next sample."""
        ...


class GenerateSampler:
    """transformers' `generate` on the hydra's model (responses.generate_responses). `synced`: the
    trunk is sharded over processes, so every process runs every token step (synced_gpus)."""

    name = "generate"
    records_split = True

    def __init__(self, hydra: HydraModel, tokenizer, synced: bool = False):
        self.hydra, self.tokenizer, self.synced = hydra, tokenizer, synced

    def sample(self, prompt_ids, args, *, greedy=False, record_split=False, carried=None) -> Responses:
        """`carried`: only where the loop carries caches (DecodeSampler)."""
        return generate_responses(
            self.hydra,
            self.tokenizer,
            prompt_ids,
            args,
            synced=self.synced,
            record_split=record_split,
            greedy=greedy,
            loop=self.loop(),
            carried=carried,
        )

    def loop(self):
        """generate_responses' `loop`: a name, or a chunk function (GraphSampler)."""
        return self.name

    def weights_changed(self) -> None:
        pass  # the loop runs the hydra's own weights


class DecodeSampler(GenerateSampler):
    """hydrappo's decode loop (decode.py) on the hydra's model: generate's chunks, shared prefill
    and recorded split states, with the loop's cheaper steps. Never synced. It carries an
    episode's KV cache from turn to turn (`carries_cache`): sample(carried=...) feeds each prompt
    from where its previous turn's cache ends and returns the caches in Responses.caches."""

    name = "decode"
    carries_cache = True

    def __init__(self, hydra: HydraModel, tokenizer):
        super().__init__(hydra, tokenizer, synced=False)


class GraphSampler(GenerateSampler):
    """generate_responses' chunks, shared prefill and recorded split states, each chunk decoded by a
    StaticDecoder of its bucket (a CUDA graph replayed per token on CUDA, the same step eagerly
    elsewhere). Never synced. The graphs read the hydra's own weights, updated in place; sample()
    checks their storage."""

    name = "graph"

    def __init__(self, hydra: HydraModel, tokenizer):
        from .graph_decode import GraphDecoding  # CUDA graph capture: loaded when this sampler is chosen

        super().__init__(hydra, tokenizer, synced=False)
        self.decoding = GraphDecoding(hydra)

    def sample(self, prompt_ids, args, *, greedy=False, record_split=False, carried=None) -> Responses:
        self.decoding.check_weights()
        return super().sample(prompt_ids, args, greedy=greedy, record_split=record_split, carried=carried)

    def loop(self):
        return self.decoding.chunk


class ContinuousBatchingSampler:
    """transformers' continuous batching (`model.generate_batch`, paged attention).

    The paged cache is sized for the call's own workload (every row's prompt and response at
    once, in pages of `page_size` tokens): transformers' own default fills a share of the free
    memory (60% of the RAM on a CPU), which costs seconds of zeroing per call there.
    Stop strings end a row after the fact: the row is trimmed at its first stop (first_stop),
    as `generate`'s rows are, but it is sampled up to max_new_tokens (or an EOS) first; so the
    responses are the same, only the work is not. `generation.min_new_tokens` has no
    continuous-batching processor and is refused by the config checks."""

    name = "continuous_batching"
    records_split = False

    def __init__(self, hydra: HydraModel, tokenizer, page_size: int = 32):
        self.hydra, self.tokenizer, self.page_size = hydra, tokenizer, page_size

    def weights_changed(self) -> None:
        pass  # generate_batch runs the hydra's own weights

    def cache_config(self, prompt_ids: list[list[int]], max_new_tokens: int):
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        pages = sum(math.ceil((len(p) + max_new_tokens) / self.page_size) for p in prompt_ids)
        # Prefix sharing would make rows of one prompt share pages; sizing for none is an upper bound.
        return ContinuousBatchingConfig(page_size=self.page_size, num_blocks=pages + 1, allow_block_sharing=False)

    @torch.no_grad()
    def sample(self, prompt_ids, args, *, greedy=False, record_split=False) -> Responses:
        if record_split:
            raise ValueError("the continuous-batching sampler records no split states (records_split is False)")
        config: GenerationConfig = generation_config(args, self.tokenizer, greedy)
        stop_ids = {self.tokenizer.eos_token_id, *args.stop_token_ids}
        prompts = [list(p) for p in prompt_ids]
        # The random draws come from torch's global generator (transformers seeds its sampling
        # from it), so a seeded run samples the same responses again, and resumes exactly.
        outputs = self.hydra.model.generate_batch(
            prompts,
            generation_config=config,
            continuous_batching_config=self.cache_config(prompts, args.max_new_tokens),
            warmup=False,
        )
        if len(outputs) != len(prompts) or any(o.error for o in outputs.values()):
            errors = [o.error for o in outputs.values() if o.error]
            raise RuntimeError(
                f"continuous batching returned {len(outputs)} of {len(prompts)} responses"
                + (f": {errors[0]}" if errors else "")
            )
        responses, ended = [], []
        for output in outputs.values():  # generate_batch returns them in the order of the inputs
            length, stopped = first_stop(
                list(output.generated_tokens), stop_ids, list(args.stop_strings), self.tokenizer
            )
            responses.append(list(output.generated_tokens[:length]))
            ended.append(stopped)
        return Responses(prompt_ids=prompts, response_ids=responses, ended=ended)


def resolve_sampler(name: str, device, synced: bool = False, quantized: bool = False) -> str:
    """The sampler `generation.sampler` names; `auto`: DEFAULT_SAMPLER's for the device type,
    and generate for a trunk sharded over processes (only it runs in lockstep). A quantized trunk
    never gets the graph sampler from `auto`: bitsandbytes' kernels were not measured in a graph."""
    if name != "auto":
        return name
    chosen = "generate" if synced else DEFAULT_SAMPLER.get(torch.device(device).type, "generate")
    return "generate" if chosen == "graph" and quantized else chosen


def build_sampler(args: GenerationArgs, hydra: HydraModel, tokenizer, *, synced: bool = False) -> Sampler:
    """The sampler of `args.sampler` for this hydra (built once per run)."""
    quantized = getattr(hydra, "trunk_quantization", "none") != "none"
    name = resolve_sampler(args.sampler, hydra.device, synced, quantized)
    if name == "decode":
        return DecodeSampler(hydra, tokenizer)
    if name == "graph":
        return GraphSampler(hydra, tokenizer)
    if name == "continuous_batching":
        return ContinuousBatchingSampler(hydra, tokenizer)
    if name == "vllm":
        from .serving import ServingEngineSampler, vllm_engine  # vLLM itself only inside vllm_engine

        return ServingEngineSampler(hydra, tokenizer, vllm_engine(hydra, tokenizer, args))
    return GenerateSampler(hydra, tokenizer, synced=synced)
