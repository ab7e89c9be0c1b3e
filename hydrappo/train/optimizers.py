"""The optimizers a run can choose (`ppo.optimizer`, `train.optimizer` of the supervised stages).

    adamw      torch.optim.AdamW (Loshchilov & Hutter 2019): two float32 moments per weight; torch's
               fused kernel where it runs (plain CPU or CUDA tensors): one pass over each weight,
               its gradient and moments instead of about ten elementwise operations, 2.5x faster
               on the main job's CPU update (docs/benchmarks.md), the same update up to rounding.
    adamw8bit  bitsandbytes' AdamW8bit: the same update with both moments stored in 8 bits,
               block-wise quantized with dynamic quantization (Dettmers et al. 2022, "8-bit
               Optimizers via Block-wise Quantization"): about 2 bytes of state per weight
               instead of 8. Tensors of fewer than 4096 values keep float32 state. Runs on
               CUDA and (bitsandbytes >= 0.50) on the CPU.

Both keep their state in `optimizer.state_dict()`, which the harness saves with every
checkpoint and loads with `weights_only=True`; a run resumes bit-exactly. A checkpoint of
one optimizer cannot be resumed with the other: the states have different shapes.
"""

from __future__ import annotations

import torch

from ..config import OPTIMIZERS, ConfigError
from ..storage.checkpoint import CheckpointError


def make_optimizer(params, args) -> torch.optim.Optimizer:
    """The optimizer `args.optimizer` names (default adamw) over `params`, from an options object
    with learning_rate, weight_decay, adam_beta1/2 and adam_eps."""
    name = getattr(args, "optimizer", "adamw")
    hyper = dict(
        lr=args.learning_rate,
        betas=(args.adam_beta1, args.adam_beta2),
        eps=args.adam_eps,
        weight_decay=args.weight_decay,
    )
    if name == "adamw":
        params = list(params)
        return torch.optim.AdamW(params, **hyper, fused=fused_adamw_runs(params) or None)  # None: torch's default
    if name == "adamw8bit":
        from ..model.quantize import bitsandbytes

        return bitsandbytes().optim.AdamW8bit(params, **hyper)
    raise ConfigError(f"optimizer={name!r} is not one of: {', '.join(OPTIMIZERS)}.")


def fused_adamw_runs(params) -> bool:
    """Whether torch's fused AdamW takes `params`: plain (not sharded DTensor) floating-point
    tensors, all on the CPU or all on one CUDA device type."""
    devices = {p.device.type for p in params}
    plain = all(type(p.data) is torch.Tensor and p.dtype.is_floating_point for p in params)
    return devices in ({"cpu"}, {"cuda"}) and plain


def optimizer_name(optimizer: torch.optim.Optimizer) -> str:
    return "adamw8bit" if type(optimizer).__module__.startswith("bitsandbytes") else "adamw"


def _state_kind(state: dict) -> str | None:
    """Which optimizer wrote an optimizer state dict: AdamW keeps exp_avg, bitsandbytes state1
    (bitsandbytes 0.50 packs its tensors under one key of its own)."""
    for values in state.get("state", {}).values():
        if "state1" in values or "__bnb_optimizer_quant_state__" in values:
            return "adamw8bit"
        if "exp_avg" in values:
            return "adamw"
    return None


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load a checkpoint's optimizer state, refusing one written by the other optimizer."""
    written, wanted = _state_kind(state), optimizer_name(optimizer)
    if written is not None and written != wanted:
        raise CheckpointError(
            f"the checkpoint's optimizer state was written by {written}, but this run uses {wanted}: resume with the "
            f"optimizer it started with (optimizer: {written}), or start a new run."
        )
    optimizer.load_state_dict(state)


def apply_optimizer_options(optimizer: torch.optim.Optimizer, scheduler, args) -> None:
    """A resumed run's own hyper-parameters over the ones a checkpoint's optimizer and scheduler
    state carry (torch restores lr, betas, eps, weight_decay and the base learning rate): the
    learning rate where this run's schedule has it at this step."""
    scheduler.base_lrs = [args.learning_rate for _ in optimizer.param_groups]
    factors = [fn(scheduler.last_epoch) for fn in scheduler.lr_lambdas]
    for group, factor in zip(optimizer.param_groups, factors):
        group.update(
            initial_lr=args.learning_rate,
            lr=args.learning_rate * factor,
            weight_decay=args.weight_decay,
            betas=(args.adam_beta1, args.adam_beta2),
            eps=args.adam_eps,
        )
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
