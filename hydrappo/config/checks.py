"""One validation pass over a whole config before anything is loaded.

Every option is checked (its range or its choices, then the combinations of options, then
the paths it names: config/paths.py), and every problem found is reported at once, each
as `section.option=value: the rule. The fix.`, in one ConfigError. Options that would be
ignored without a word in the combination given (kl_target with the fixed controller, a
system prompt without the chat template, ...) are errors too: a user who set them expects
them to act.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import typing

from ..model.band import BandSyntaxError, band_problem, parse_band
from ..model.lora import lora_problems
from ..model.quantize import TRUNK_QUANTIZATIONS
from .paths import check_paths
from .options import DTYPE_RULE, ConfigError, canonical_dtype
from .problems import Problems, default_of, launched_processes, warn_once
from .sections import Config, DPOConfig, RewardConfig, SFTConfig, choices_of
from .train_checks import check_train
from .values import MAX_TOKENS


# Options naming a column or a split: an empty name can only be a mistake.
NAMES = (
    "prompt_column",
    "chosen_column",
    "rejected_column",
    "response_column",
    "stats_response_column",
    "split",
    "eval_split",
)

_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?|xpu(:\d+)?)$")


def is_device_name(name) -> bool:
    """auto, cpu, mps, cuda, cuda:N (xpu, xpu:N)."""
    return isinstance(name, str) and bool(_DEVICE.match(name))


def _optional(cls, name: str) -> bool:
    """Whether the field is declared `X | None` (read from the annotations: argument parsers
    rewrite `dataclasses.fields(...).type` in place)."""
    return type(None) in typing.get_args(typing.get_type_hints(cls).get(name))


def _whole(cls, name: str) -> bool:
    """Whether the field is declared `int` (or `int | None`)."""
    return typing.get_type_hints(cls).get(name) in (int, int | None)


def _sections(config):
    return [(f.name, getattr(config, f.name)) for f in dataclasses.fields(config)]


def _check_values(config, problems: Problems) -> None:
    """Each option on its own: its type, its range (the field's metadata) or its choices (the words
    of its `Literal[...]` type)."""
    for section, part in _sections(config):
        for f in dataclasses.fields(part):
            name, value, label = f.name, getattr(part, f.name), f"{section}.{f.name}"
            default, choices = default_of(type(part), name), choices_of(type(part)).get(name)
            rule = f.metadata.get("range")
            if rule is not None and value is not None:
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    problems.add(label, value, "must be a number", f"use e.g. {default!r} (the default)")
                elif not isinstance(value, int) and _whole(type(part), name):  # e.g. 1e29 through the Python API
                    problems.add(label, value, "must be a whole number", f"use e.g. {default!r} (the default)")
                elif not rule.holds(value):
                    problems.add(label, value, rule.describe(value), rule.fix or f"use e.g. {default!r} (the default)")
            elif choices is not None and value not in choices:
                problems.add(
                    label, value, f"is not one of: {', '.join(choices)}", f"use e.g. {default!r} (the default)"
                )
            elif (
                name in NAMES
                and (not isinstance(value, str) or not value.strip())
                and not (
                    value is None and _optional(type(part), name)  # an optional column (null: there is none)
                )
            ):
                problems.add(label, value, "must name a column or split", f"use e.g. {default!r} (the default)")
    model = config.model
    try:
        canonical_dtype(model.dtype)
    except ConfigError:
        problems.add(
            "model.dtype", model.dtype, DTYPE_RULE, "use auto (float32 on CPU, bfloat16 on GPUs that support it)"
        )
    device = config.train.device
    if not is_device_name(device):
        problems.add("train.device", device, "must be auto, cpu, cuda, cuda:N or mps", "use auto")
    lora = getattr(config, "lora", None)
    if lora is not None and lora.lora_dropout != 0:
        problems.note(
            f"lora.lora_dropout={lora.lora_dropout!r}: hydrappo runs every model without dropout (PPO's importance ratio "
            "compares one fixed policy with itself, and cached trunk outputs assume deterministic layers); set "
            "lora_dropout: 0."
        )
    generation = getattr(config, "generation", None)
    if generation is not None:
        for token_id in generation.stop_token_ids:
            if not isinstance(token_id, int) or not 0 <= token_id <= MAX_TOKENS:
                problems.add(
                    "generation.stop_token_ids",
                    generation.stop_token_ids,
                    f"must be token ids (integers from 0 to {MAX_TOKENS})",
                    "list the ids of the tokens that end a response, e.g. [13]",
                )
                break
        if any(not isinstance(text, str) or not text for text in generation.stop_strings):
            problems.add(
                "generation.stop_strings",
                generation.stop_strings,
                "must be non-empty strings",
                "remove the empty entry",
            )


def _check_common(config, problems: Problems) -> None:
    """Combinations every command shares: chat template, LoRA, a quantized or sharded trunk."""
    _check_band(config, problems)
    _check_trunk(config, problems)
    data = config.data
    if data.system_prompt and not data.apply_chat_template:
        problems.add(
            "data.system_prompt",
            data.system_prompt,
            "is only used with data.apply_chat_template: true",
            "set apply_chat_template: true, or remove system_prompt",
        )
    lora = getattr(config, "lora", None)
    if lora is not None:
        model = config.model
        problems.report(
            *lora_problems(
                lora.lora_r > 0,
                model.num_layers_unfrozen,
                lora.lora_layers,
                lora.lora_init_adapter,
                model.train_lm_head,
                model.train_final_norm,
            )
        )
    if lora is not None and lora.lora_r == 0 and lora.lora_layers != "top":
        problems.add(
            "lora.lora_layers",
            lora.lora_layers,
            "has no effect while lora.lora_r is 0 (LoRA off)",
            "set lora_r > 0 (e.g. 16), or remove lora_layers",
        )


def _check_band(config, problems: Problems) -> None:
    """model.trainable_layers: its syntax and shape (the model's layer count is checked when it is
    built), and the options it cannot serve."""
    model, lora = config.model, getattr(config, "lora", None)
    if model.trainable_layers is None:
        return
    option, value = "model.trainable_layers", model.trainable_layers
    try:
        band = parse_band(value)
    except BandSyntaxError as error:
        problems.add(option, value, error.rule, error.fix)
        return
    shape = band_problem(band)
    if shape is not None:
        problems.add(option, value, *shape)
    if model.num_layers_unfrozen != default_of(type(model), "num_layers_unfrozen"):
        problems.add(
            option,
            value,
            f"and model.num_layers_unfrozen={model.num_layers_unfrozen} both say which layers train",
            "keep one: the band, or num_layers_unfrozen for the top N layers (-1: every layer)",
        )
    if lora is not None and lora.lora_r > 0 and lora.lora_layers == "all":
        problems.add(
            option,
            value,
            "cannot be combined with LoRA in every layer (lora.lora_layers: all)",
            "use lora_layers: top for adapters in the band's layers only, or remove trainable_layers",
        )


def _check_trunk(config, problems: Problems) -> None:
    """model.trunk_quantization, train.fsdp_trunk and the 8-bit optimizer: each needs a frozen
    trunk below the trained layers, or bitsandbytes."""
    model, train, lora = config.model, config.train, getattr(config, "lora", None)
    quantized = model.trunk_quantization in TRUNK_QUANTIZATIONS[1:]
    fsdp = bool(getattr(train, "fsdp_trunk", False))
    adapters_everywhere = lora is not None and lora.lora_r > 0 and lora.lora_layers == "all"
    for option, value, on in (
        ("model.trunk_quantization", model.trunk_quantization, quantized),
        ("train.fsdp_trunk", True, fsdp),
    ):
        if not on:
            continue
        if model.num_layers_unfrozen == -1:
            problems.add(
                option,
                value,
                "acts on the frozen bottom of the trunk, but model.num_layers_unfrozen=-1 trains every layer",
                f"set num_layers_unfrozen to a number of top layers (e.g. 2), or remove {option}",
            )
        if adapters_everywhere:
            problems.add(
                option,
                value,
                "acts on the frozen bottom of the trunk, but lora.lora_layers='all' puts adapters in every layer",
                f"use lora_layers: top, or remove {option}",
            )
    if quantized and fsdp:
        problems.add(
            "train.fsdp_trunk",
            True,
            f"shards the frozen trunk and model.trunk_quantization="
            f"{model.trunk_quantization!r} quantizes it: choose one",
            "set fsdp_trunk: false (each process can hold a whole quantized trunk), or trunk_quantization: none",
        )
    optimizer_option, optimizer = f"{config.OPTIMIZER}.optimizer", getattr(config, config.OPTIMIZER).optimizer
    wanted = [
        f"{name}={value!r}"
        for name, value, on in (
            ("model.trunk_quantization", model.trunk_quantization, quantized),
            (optimizer_option, optimizer, optimizer == "adamw8bit"),
        )
        if on
    ]
    if wanted and importlib.util.find_spec("bitsandbytes") is None:
        problems.note(
            f"{' and '.join(wanted)}: needs bitsandbytes, which is not installed. Run "
            "`pip install 'hydrappo[quant]'`, or use trunk_quantization: none and optimizer: adamw."
        )
    if fsdp and launched_processes() <= 1:
        warn_once(
            "train.fsdp_trunk=true shards the frozen trunk over the processes of a torchrun / accelerate launch "
            "run; this run has one process, so the trunk stays whole."
        )


def validate(config) -> None:
    """Check every option of a Config, RewardConfig or SFTConfig (values, combinations,
    paths); raise one ConfigError listing every problem, each with its fix."""
    problems = Problems()
    _check_values(config, problems)
    _check_common(config, problems)
    OWN_RULES[type(config)](config, problems)
    check_paths(config, problems)
    problems.raise_if_any()
    _warn_sampling(config)


def _warn_sampling(config) -> None:
    """What is legal but probably not meant: said once per process."""
    gen = getattr(config, "generation", None)
    if gen is not None and (gen.top_p < 1.0 or gen.top_k > 0):
        warn_once(
            f"generation.top_p={gen.top_p}, top_k={gen.top_k}: responses are sampled from a truncated distribution, but "
            "PPO's log-probs, ratios and KL use the full one, so the updates are slightly off-policy. Use top_p: 1.0 and "
            "top_k: 0 unless you mean it."
        )


def _check_stage(config, problems: Problems) -> None:
    """What the supervised stages share."""
    data, train = config.data, config.train
    if not data.train_file:
        problems.add(
            "data.train_file",
            data.train_file,
            "is required",
            "name a jsonl/json/csv/parquet file, a directory of them or a datasets name",
        )
    if train.epochs < 1 and train.max_steps < 1 and train.epochs >= 0 and train.max_steps >= 0:
        problems.add(
            "train.epochs",
            train.epochs,
            "and train.max_steps are both 0: nothing would train",
            "set epochs or max_steps to at least 1",
        )


def _check_reward_stage(config: RewardConfig, problems: Problems) -> None:
    _check_stage(config, problems)
    model = config.model
    if model.train_lm_head:
        problems.add(
            "model.train_lm_head", True, "has no use in the reward stage (only the reward branch trains)", "remove it"
        )
    if model.num_layers_unfrozen == -1:
        problems.add(
            "model.num_layers_unfrozen",
            -1,
            "leaves no frozen trunk for a reward branch to sit on",
            "use the N of the PPO run that will use the branch, e.g. 2",
        )


def _check_sft_stage(config: SFTConfig, problems: Problems) -> None:
    _check_stage(config, problems)
    model = config.model
    if model.reward_branch_path:
        problems.add("model.reward_branch_path", model.reward_branch_path, "has no use in sft", "remove it")
    if model.num_layers_unfrozen == 0 and not (model.train_lm_head or model.train_final_norm):
        problems.add(
            "model.num_layers_unfrozen",
            0,
            "with a frozen lm_head and final norm leaves nothing to train",
            "set num_layers_unfrozen >= 1 (or train_lm_head: true)",
        )


def _check_dpo_stage(config: DPOConfig, problems: Problems) -> None:
    from ..algo.preference import LOSS_TYPES, NEEDS_REFERENCE

    _check_stage(config, problems)
    model, dpo = config.model, config.dpo
    if model.reward_branch_path:
        problems.add("model.reward_branch_path", model.reward_branch_path, "has no use in dpo", "remove it")
    kinds = dpo.loss_types
    unknown = [kind for kind in kinds if kind not in LOSS_TYPES]
    if not kinds or unknown:
        problems.add(
            "dpo.loss_type",
            dpo.loss_type,
            f"names {', '.join(map(repr, unknown))}, not a loss hydrappo has" if unknown else "names no loss",
            f"choose from {', '.join(LOSS_TYPES)} (several as a list, summed with loss_weights)",
        )
    if dpo.loss_weights is not None and len(dpo.loss_weights) != len(kinds):
        problems.add(
            "dpo.loss_weights",
            dpo.loss_weights,
            f"has {len(dpo.loss_weights)} weights for {len(kinds)} loss types ({', '.join(kinds)})",
            "give one weight per loss_type, or none (1 each)",
        )
    if dpo.label_smoothing > 0 and not {"sigmoid", "robust", "simpo"} & set(kinds):
        problems.add(
            "dpo.label_smoothing",
            dpo.label_smoothing,
            f"has no effect on {', '.join(kinds)}",
            "use it with loss_type sigmoid (cDPO), robust or simpo, or set it to 0",
        )
    if (
        model.num_layers_unfrozen == 0
        and not (model.train_lm_head or model.train_final_norm)
        and config.lora.lora_r == 0
    ):
        problems.add(
            "model.num_layers_unfrozen",
            0,
            "with a frozen lm_head and final norm leaves nothing to train",
            "set num_layers_unfrozen >= 1 or a band (model.trainable_layers), or LoRA (lora.lora_r > 0)",
        )
    if set(kinds) & set(NEEDS_REFERENCE) and model.num_layers_unfrozen == -1 and config.lora.lora_r == 0:
        warn_once(
            "dpo with every layer training (model.num_layers_unfrozen: -1) keeps a frozen copy of the whole model as "
            "its reference: twice the model's memory. A band, the top layers or LoRA share the frozen layers instead."
        )


# Each command's own rules, by its config class (a new stage adds a row); validate runs the
# rules every config shares before them.
OWN_RULES = {
    Config: check_train,
    RewardConfig: _check_reward_stage,
    SFTConfig: _check_sft_stage,
    DPOConfig: _check_dpo_stage,
}
