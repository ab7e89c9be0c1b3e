"""LoRA on the hydra through peft: the reference for free.

With adapters only in the top N layers, the reference policy is those same layers with
the adapters switched off (`PeftModel.disable_adapter()`): no layer is copied. With
adapters in every layer, the trunk itself changes, so the reference costs a second
trunk pass with adapters off; still one model in memory.

Starting from a trained adapter (e.g. after SFT with LoRA), the adapter is merged into
the base weights first and a fresh adapter is trained on top. The reference (adapters
off) is then the starting policy, not the bare base model (the bug of trl#495).
"""

from __future__ import annotations

import copy
from pathlib import Path

from torch import nn

from ..errors import Problem, UsageError


def lora_problems(
    lora_on: bool, num_layers_unfrozen, lora_layers: str, lora_init_adapter, train_lm_head: bool, train_final_norm: bool
) -> list[Problem]:
    """The rules LoRA sets for the other options (`lora_on`: lora.lora_r > 0): config/checks.py
    reports them, HydraModel raises them."""
    found = []
    if lora_init_adapter and not lora_on:
        found.append(
            Problem(
                "lora.lora_init_adapter",
                lora_init_adapter,
                "needs LoRA (lora.lora_r > 0), which is off",
                "set lora_r to the adapter's rank (e.g. 16), or remove lora_init_adapter",
            )
        )
    if lora_on and lora_layers == "top" and num_layers_unfrozen == 0:
        found.append(
            Problem(
                "model.num_layers_unfrozen",
                0,
                "leaves LoRA on the top layers (lora.lora_layers: top) nothing to adapt",
                "set num_layers_unfrozen >= 1, or lora_layers: all",
            )
        )
    for name, on in (("train_lm_head", train_lm_head), ("train_final_norm", train_final_norm)):
        if lora_on and on:
            found.append(
                Problem(
                    f"model.{name}",
                    True,
                    "cannot be combined with LoRA (lora.lora_r > 0): only adapters (and the value head) train",
                    f"set {name}: false, or lora_r: 0",
                )
            )
    return found


def linear_module_names(layers: nn.ModuleList) -> list[str]:
    """Leaf names of the linear maps inside the decoder layers (q_proj, c_attn, ...):
    what "all-linear" means for the trunk. Resolved here because peft accepts a layer
    selection only with an explicit list, and this way the lm_head is never adapted."""
    from transformers.pytorch_utils import Conv1D

    names = {
        name.rpartition(".")[2]
        for layer in layers
        for name, module in layer.named_modules()
        if isinstance(module, (nn.Linear, Conv1D))
    }
    return sorted(names)


def attach_lora(
    model: nn.Module, lora_config, layers: nn.ModuleList, layer_indices: list[int] | None, layers_pattern: str
):
    """Wrap `model` with peft; adapters go into `layer_indices` only (None: every layer).

    peft edits the model's modules in place, so the transformers model object stays the
    one the hydra knows; the returned PeftModel is kept for adapter switching and saving.
    """
    from peft import LoraConfig, get_peft_model

    options = {k: v for k, v in lora_config.to_dict().items() if k in LoraConfig.__dataclass_fields__}
    if options.get("target_modules") in ("all-linear", ["all-linear"], {"all-linear"}):
        options["target_modules"] = linear_module_names(layers)
    options["lora_dropout"] = 0.0
    # GPT-2-style Conv1D stores its weight transposed; peft would fix it with a warning.
    from transformers.pytorch_utils import Conv1D

    options["fan_in_fan_out"] = any(isinstance(m, Conv1D) for m in layers.modules())
    if layer_indices is not None:
        options.update(layers_to_transform=list(layer_indices), layers_pattern=layers_pattern)
    return get_peft_model(model, LoraConfig(**options))


def merge_adapter(model: nn.Module, adapter_path: str | Path) -> nn.Module:
    """Fold a trained peft adapter into the base weights and return the plain model."""
    from peft import PeftModel

    path = Path(adapter_path)
    if not (path / "adapter_config.json").is_file():
        raise UsageError(
            f"{path} is not a peft adapter folder (no adapter_config.json): point lora_init_adapter at the folder "
            "written by PeftModel.save_pretrained (a hydrappo LoRA checkpoint has one in adapter/)."
        )
    return PeftModel.from_pretrained(model, str(path)).merge_and_unload()


def strip_lora(module: nn.Module) -> nn.Module:
    """A copy of `module` with every peft LoRA wrapper replaced by its base layer
    (the original weights), e.g. to seed a reward branch from the base top layers."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    clone = copy.deepcopy(module)
    for name, child in list(clone.named_modules()):
        if isinstance(child, BaseTunerLayer):
            parent_name, _, attr = name.rpartition(".")
            parent = clone.get_submodule(parent_name) if parent_name else clone
            setattr(parent, attr, child.get_base_layer())
    return clone


def merged_model(hydra) -> nn.Module:
    """A plain transformers model equal to the LoRA policy: the adapters folded into a
    copy of the base weights (the hydra itself is left as it was)."""
    if hydra.peft_model is None:
        raise ValueError("this hydra has no LoRA adapters to merge.")
    merged = copy.deepcopy(hydra.peft_model).merge_and_unload()
    merged.requires_grad_(False)
    return merged
