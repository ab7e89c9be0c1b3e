"""A serving engine behind the sampler interface (`generation.sampler: vllm`).

The engine keeps its own copy of the policy's model in this process, on the training GPU, and
samples with its own kernels (paged attention, CUDA graphs, continuous batching). The old
log-probs still come from the experience pass (samplers.py), so the engine's numerics never
enter the loss; the engine only has to hold the policy's current weights.

What reaches the engine, and when:

- its model is built empty (vLLM's `load_format="dummy"`) from a folder holding the policy's
  config and tokenizer, and the FIRST sample loads every weight of the policy's model once:
  the frozen trunk is loaded once, from the hydra itself, so the engine's trunk is exactly the
  one being trained on whatever it came from (a random init, a merged init adapter, a GGUF
  conversion, the dtype it was cast to), and the checkpoint is not read from disk a second time;
- after that, only the weights that train (model/engine_weights.py: the top N layers, the final
  norm and the lm_head when they train, the merged weights of LoRA-adapted layers), never the
  frozen bottom, the reference copy, the value head or the reward branch;
- lazily, before the next sample after `weights_changed()` (the trainer calls it after an
  update that changed the policy), not after every optimizer step: a PPO step takes
  ppo_epochs x minibatches optimizer steps between two samplings, and pushing after each would
  copy the top layers that many times for one use. Two samples without an update in between
  push nothing the second time.

The engine is reached through a small seam, `ServingEngine` (`load_weights`, `generate`), so
the CPU tests drive the sampler with a fake engine that records what is pushed and when;
`VllmEngine` is the vLLM implementation, imported only when this sampler is chosen.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import socket
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import torch

from ..config import GenerationArgs
from ..errors import UsageError
from ..model import HydraModel
from ..model.engine_weights import engine_weights
from .responses import Responses
from .stops import first_stop

# The vLLM releases whose wheels pin torch==2.13.0, hydrappo's tested torch (docs/sampling.md):
# 0.33 pins torch 2.14.0, and pip would replace the torch a user has.
VLLM_EXTRA = "pip install 'hydrappo[vllm]'"


@dataclass(frozen=True)
class EngineRequest:
    """One row to sample, in the engine's terms. `temperature` 0 means greedy."""

    prompt_ids: list[int]
    max_new_tokens: int
    min_new_tokens: int
    temperature: float
    top_p: float
    top_k: int  # 0: off
    stop_token_ids: tuple[int, ...]  # EOS among them
    stop_strings: tuple[str, ...]
    seed: int | None  # the row's own random stream (None: greedy)


class ServingEngine(Protocol):
    """What the sampler needs of an engine."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy these tensors, named as in the transformers checkpoint, into the engine's model."""
        ...

    def generate(self, requests: list[EngineRequest]) -> list[list[int]]:
        """The generated token ids of each request, in order (a stop token included; the
        sampler trims at the first stop itself)."""
        ...


class ServingEngineSampler:
    """Samples with a serving engine that holds a copy of the policy (module doc). Records no
    split states: the experience pass runs the whole trunk."""

    records_split = False

    def __init__(self, hydra: HydraModel, tokenizer, engine: ServingEngine, name: str = "vllm"):
        self.hydra, self.tokenizer, self.engine, self.name = hydra, tokenizer, engine, name
        self.weights = engine_weights(hydra)
        self.trained = [weight for weight in self.weights if weight.trains]
        self._loaded = False  # the engine's model holds no weight of the policy yet
        self._changed = False

    def weights_changed(self) -> None:
        """The policy's trainable weights changed (an update): push them before the next sample."""
        self._changed = True

    @torch.no_grad()
    def sync_weights(self) -> int:
        """Push what the engine lacks: every weight the first time, then the trained ones after
        a change, else nothing. Returns the number of tensors pushed."""
        if self._loaded and not self._changed:
            return 0
        chosen = self.trained if self._loaded else self.weights
        # Merged LoRA weights are computed in the weights' own dtype, not under the run's autocast.
        with torch.autocast(self.hydra.device.type, enabled=False):
            self.engine.load_weights((weight.name, weight.read()) for weight in chosen)
        self._loaded, self._changed = True, False
        return len(chosen)

    def sample(self, prompt_ids, args: GenerationArgs, *, greedy=False, record_split=False) -> Responses:
        if record_split:
            raise ValueError(f"the {self.name} sampler records no split states (records_split is False)")
        self.sync_weights()
        prompts = [list(p) for p in prompt_ids]
        eos = self.tokenizer.eos_token_id
        stop_ids = tuple(dict.fromkeys([*([eos] if eos is not None else []), *args.stop_token_ids]))
        # One seed per row from torch's global generator (seeded by the run, saved in every
        # checkpoint): a seeded run samples the same responses again and resumes exactly,
        # whatever order the engine schedules the rows in.
        seeds = [None] * len(prompts) if greedy else torch.randint(2**31 - 1, (len(prompts),)).tolist()
        requests = [
            EngineRequest(
                prompt, max_new_tokens=args.max_new_tokens, min_new_tokens=args.min_new_tokens,
                temperature=0.0 if greedy else args.temperature, top_p=1.0 if greedy else args.top_p,
                top_k=0 if greedy else args.top_k, stop_token_ids=stop_ids, stop_strings=tuple(args.stop_strings),
                seed=seed,
            )
            for prompt, seed in zip(prompts, seeds)
        ]  # fmt: skip
        outputs = self.engine.generate(requests)
        if len(outputs) != len(prompts):
            raise RuntimeError(f"the {self.name} engine returned {len(outputs)} responses for {len(prompts)} prompts")
        responses, ended = [], []
        for tokens in outputs:
            tokens = list(tokens)[: args.max_new_tokens]
            # Trimmed at the first stop exactly as generate's rows are: the stop kept, and a stop
            # string ends the row at the token that completes it.
            length, stopped = first_stop(tokens, set(stop_ids), list(args.stop_strings), self.tokenizer)
            responses.append(tokens[:length])
            ended.append(stopped)
        return Responses(prompt_ids=prompts, response_ids=responses, ended=ended)


# ---------------------------------------------------------------------------- vLLM
class VllmEngine:
    """vLLM's offline `LLM` colocated in this process, as TRL's colocate mode runs it
    (trl/generation/vllm_generation.py: `distributed_executor_backend="external_launcher"`,
    weights pushed with the vLLM model's own `load_weights`, the prefix cache reset after).

    external_launcher keeps vLLM's engine core and its one worker in this process (it turns
    VLLM_ENABLE_V1_MULTIPROCESSING off) and joins the torchrun process group, one engine per
    process (tensor parallel size 1). So `apply_model` hands the pushed tensors to the model by
    reference: no copy through a pipe, no serialisation. Read in vLLM 0.32's source:
    `LLM.apply_model(fn)` runs fn(model) in each worker (v1/worker/worker_base.py), and
    config/parallel.py switches multiprocessing off for external_launcher. Its worker's
    `reload_weights(weights_iterator=...)` is not used: it reloads layer by layer from the meta
    device, made for a whole set of weights, not the few that train. Not validated on a GPU yet
    (docs/sampling.md, open points)."""

    def __init__(self, folder: str, *, dtype: str, gpu_memory: float, seed: int):
        _launcher_environment()
        from vllm import LLM

        self.llm = LLM(
            model=folder,
            dtype=dtype,
            # Built empty: the first push loads every weight from the hydra (module doc).
            load_format="dummy",
            # The model's generation_config.json would add its own EOS ids and defaults; the
            # sampling settings are the run's, sent with every request.
            generation_config="vllm",
            gpu_memory_utilization=gpu_memory,
            distributed_executor_backend="external_launcher",
            tensor_parallel_size=1,
            seed=seed,
        )

    def load_weights(self, weights) -> None:
        # vLLM's model maps checkpoint names onto its fused layers (q/k/v -> qkv_proj, gate/up ->
        # gate_up_proj) itself; a partial set of names loads just those.
        self.llm.apply_model(lambda model: model.load_weights(weights))
        # KV blocks cached for earlier prompts were computed with the old weights.
        self.llm.reset_prefix_cache()

    def generate(self, requests: list[EngineRequest]) -> list[list[int]]:
        from vllm import SamplingParams

        params = [
            SamplingParams(
                n=1, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_tokens=r.max_new_tokens,
                min_tokens=r.min_new_tokens, stop_token_ids=list(r.stop_token_ids), stop=list(r.stop_strings) or None,
                include_stop_str_in_output=True, skip_special_tokens=False, detokenize=bool(r.stop_strings),
                seed=r.seed,
            )
            for r in requests
        ]  # fmt: skip
        prompts = [{"prompt_token_ids": r.prompt_ids} for r in requests]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [list(output.outputs[0].token_ids) for output in outputs]


def _launcher_environment() -> None:
    """external_launcher reads torchrun's variables; a run without a launcher is process 0 of 1."""
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(name, value)
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(probe.getsockname()[1])


def write_engine_folder(hydra: HydraModel, tokenizer, folder: str) -> None:
    """The policy's config and tokenizer, what the engine builds its (empty) model from. The
    config is the hydra's own: a trained lm_head was untied from the embeddings, and the engine's
    model must have its own lm_head for the pushed one to land."""
    config = copy.deepcopy(hydra.model.config)
    config.architectures = [type(hydra.model).__name__]
    config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def vllm_engine(hydra: HydraModel, tokenizer, args: GenerationArgs) -> VllmEngine:
    """vLLM for this hydra, or a UsageError that says what is missing (the CLI prints it
    without a traceback)."""
    if importlib.util.find_spec("vllm") is None:
        raise UsageError(
            f"generation.sampler='vllm' needs vLLM, which is not installed: {VLLM_EXTRA} (vLLM 0.29 to 0.32, the "
            "releases built for torch 2.13), or use sampler: auto."
        )
    if hydra.device.type != "cuda":
        raise UsageError(
            f"generation.sampler='vllm': vLLM's engine runs on a CUDA GPU, and this run's model is on "
            f"{hydra.device}; use sampler: auto (or generate) here."
        )
    folder = tempfile.TemporaryDirectory(prefix="hydrappo-engine-")
    write_engine_folder(hydra, tokenizer, folder.name)
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    dtype = str(next(hydra.model.parameters()).dtype).removeprefix("torch.")
    engine = VllmEngine(folder.name, dtype=dtype, gpu_memory=args.engine_gpu_memory, seed=rank)
    engine.folder = folder  # kept (and removed) with the engine: vLLM holds its tokenizer's path
    return engine
