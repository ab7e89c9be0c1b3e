"""Device and mixed precision for one process: torch.autocast, loss scaling for fp16, and the
float32 master weights a low-precision model trains with.

bf16 autocast on GPUs that have it, fp16 with loss scaling on older GPUs, float32 on
the CPU. Plain torch, not accelerate's Accelerator: that one keeps process-wide state
which refuses a second trainer with other settings in the same process (a notebook,
a test suite, a reward stage followed by PPO).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from ..algo.masked import widened
from ..config import ConfigError

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def pick_mixed_precision(name: str, device: torch.device) -> str:
    if name != "auto":
        return name
    if device.type != "cuda":
        return "no"
    return "bf16" if torch.cuda.is_bf16_supported() else "fp16"


class MixedPrecision:
    """Autocast context, backward and optimizer step with fp16 loss scaling when needed."""

    def __init__(self, mode: str, device: torch.device):
        if mode not in ("no", "bf16", "fp16"):
            raise ValueError(f"mixed precision {mode!r}: use no, bf16 or fp16.")
        self.mode = mode
        self.device = device
        self.scaler = torch.amp.GradScaler(device.type, enabled=mode == "fp16")

    @property
    def enabled(self) -> bool:
        return self.mode != "no"

    def autocast(self):
        if not self.enabled:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=_DTYPES[self.mode])

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def clip_grad_norm_(self, optimizer, params, max_norm: float) -> float:
        """Unscale (fp16), then clip; returns the norm before clipping (inf/nan if overflowed)."""
        self.scaler.unscale_(optimizer)
        params = [p for p in params if p.grad is not None]
        if not params:
            return 0.0
        if max_norm and max_norm > 0:
            return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        return float(torch.linalg.vector_norm(torch.stack([widened(p.grad.detach()).norm() for p in params])))

    def step(self, optimizer) -> None:
        self.scaler.step(optimizer)
        self.scaler.update()

    def state_dict(self) -> dict:
        return self.scaler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if state:
            self.scaler.load_state_dict(state)


def keep_float32_master_weights(params: list[torch.nn.Parameter], mixed_precision: str) -> None:
    """Trainable parameters of a bf16/fp16 model are kept in float32.

    AdamW on bf16 weights rounds most updates away: a step of 1e-5 on a weight of 0.02 is
    below bf16's resolution there. The frozen trunk stays in low precision (that is where
    the memory is); autocast runs the mixed model, so it must be on."""
    low_precision = [p for p in params if p.dtype in (torch.bfloat16, torch.float16)]
    if not low_precision:
        return
    if mixed_precision == "no":
        raise ConfigError(
            f"the model's weights are {low_precision[0].dtype} but train.mixed_precision is 'no': hydrappo keeps the "
            "trainable weights in float32 and needs autocast to run the mixed model. Set train.mixed_precision to "
            "auto/bf16/fp16, or model.dtype to float32."
        )
    for param in low_precision:
        param.data = param.data.float()
