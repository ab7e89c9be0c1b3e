"""What a planned run keeps in memory besides the model: the training settings, and the
constants of the plan (GPU sizes, headroom, log-prob chunk copies)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import DTYPE_NAMES, torch_dtype
from ..model.band import band_problem, parse_band
from ..model.quantize import TRUNK_QUANTIZATIONS

GIB = 2**30
GPU_SIZES_GIB = (8, 12, 16, 24, 48, 80)
FRAGMENTATION = 1.10
CUDA_CONTEXT_GIB = 0.75
DTYPES = tuple(name for canonical, aliases in DTYPE_NAMES.items() for name in (canonical, *aliases))
OPTIMIZERS = ("adamw", "adamw8bit", "sgd")
DEVICES = ("cuda", "cpu")
SAMPLERS = ("decode", "generate", "graph")  # the ones whose memory differs: graph holds its KV cache
# Float32 copies of one logits chunk alive at the peak of a log-prob chunk, as counted for the
# chunked code before the fused pass over the vocabulary (commit 27cf8e9): forward with entropy
# (logits, exp for logsumexp, softmax, softmax*logits) and backward (recomputed logits, their
# gradient, one temporary). The fused pass (hydrappo/model/logprobs.py) holds at most the
# block's logits, its exponentials and one product (on the GPU one block is the whole chunk),
# so these bound it from above; they were not re-measured on a GPU since.
CHUNK_COPIES_EVAL = 4
CHUNK_COPIES_UPDATE = 3


@dataclass
class TrainingSettings:
    """What a PPO run keeps in memory besides the model. Lengths are in tokens."""

    num_layers_unfrozen: int = 2
    # A band 'START:END' of trainable layers instead of the top N (model/band.py; num_layers_unfrozen is then
    # ignored): the frozen layers above it run in the update's forward and backward, so their activations count.
    trainable_layers: str | None = None
    lora_rank: int = 0  # 0: full training of the top N layers; r > 0: LoRA adapters on their linear modules
    dtype: str = "bfloat16"  # weights
    master_weights: bool | None = None  # fp32 master copy of the trainable weights (None: when dtype is not fp32)
    optimizer: str = "adamw"
    trunk_quantization: str = (
        "none"  # the frozen bottom layers (and frozen untied input embeddings): none | int8 | 4bit
    )
    batch_size: int = 16  # rollouts per PPO step (the split-hidden cache holds them all)
    mini_batch_size: int = 4
    gradient_accumulation_steps: int = 1
    generation_batch_size: int = 16
    prompt_length: int = 256
    response_length: int = 256
    reward_model: bool = True  # a reward branch on the trunk (hydra) / a reward model (classic)
    train_lm_head: bool = False
    train_final_norm: bool = False
    gradient_checkpointing: bool = False
    entropy_in_update: bool = False  # ppo.ent_coef != 0
    sampler: str = "decode"  # graph: the static KV cache of the graph sampler's bucket is held between samples
    # Where the run computes: the log-prob pass takes a chunk's whole vocabulary in one block on a GPU and
    # blocks of 2048 columns on the CPU (model/logprobs.vocab_block). The planner plans GPUs; the CPU is
    # what planner/validate.py measures on.
    device: str = "cuda"

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of: {', '.join(DTYPES)}.")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer {self.optimizer!r} is not one of: {', '.join(OPTIMIZERS)}.")
        if self.device not in DEVICES:
            raise ValueError(f"device {self.device!r} is not one of: {', '.join(DEVICES)}.")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler {self.sampler!r} is not one of: {', '.join(SAMPLERS)}.")
        if self.trunk_quantization not in TRUNK_QUANTIZATIONS:
            raise ValueError(
                f"trunk_quantization {self.trunk_quantization!r} is not one of: {', '.join(TRUNK_QUANTIZATIONS)}."
            )
        for name in (
            "batch_size",
            "mini_batch_size",
            "gradient_accumulation_steps",
            "generation_batch_size",
            "prompt_length",
            "response_length",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
        if self.num_layers_unfrozen < -1:
            raise ValueError(
                f"num_layers_unfrozen must be >= -1 (-1: the whole model), got {self.num_layers_unfrozen}."
            )
        if self.trainable_layers is not None:
            problem = band_problem(parse_band(self.trainable_layers))
            if problem is not None:
                raise ValueError(f"trainable_layers {self.trainable_layers!r} {problem[0]}; {problem[1]}.")
        if self.lora_rank < 0:
            raise ValueError("lora_rank must be >= 0 (0: no LoRA).")
        if self.mini_batch_size % self.gradient_accumulation_steps:
            raise ValueError("mini_batch_size must be a multiple of gradient_accumulation_steps.")

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch_dtype(self.dtype)

    @property
    def weight_bytes(self) -> int:
        return torch.finfo(self.torch_dtype).bits // 8

    @property
    def uses_master_weights(self) -> bool:
        if self.master_weights is None:
            return self.torch_dtype != torch.float32
        return self.master_weights and self.torch_dtype != torch.float32

    @property
    def micro_batch(self) -> int:
        return self.mini_batch_size // self.gradient_accumulation_steps

    @property
    def seq_len(self) -> int:
        return self.prompt_length + self.response_length
