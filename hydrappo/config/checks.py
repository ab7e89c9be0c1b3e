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
import logging
import os
import re
import typing

import torch

from ..algo.advantages import ESTIMATORS, group_size_problem
from ..errors import Problem
from ..model.band import BandSyntaxError, band_problem, parse_band
from ..model.lora import lora_problems
from ..model.quantize import TRUNK_QUANTIZATIONS
from .paths import check_paths
from .reward_sources import check_reward_sources
from .task import check_task, has_held_out, has_prompts, held_out_off
from .options import DTYPE_RULE, ConfigError, GenerationArgs, PPOArgs, canonical_dtype
from .sections import Config, DPOConfig, RewardConfig, SFTConfig, choices_of
from .values import MAX_TOKENS

logger = logging.getLogger("hydrappo")


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
_warned: set[str] = set()


def is_device_name(name) -> bool:
    """auto, cpu, mps, cuda, cuda:N (xpu, xpu:N)."""
    return isinstance(name, str) and bool(_DEVICE.match(name))


class Problems:
    """The problems found in one pass; `raise_if_any` raises them as one ConfigError."""

    def __init__(self):
        self.messages: list[str] = []

    def add(self, option: str, value, rule: str, fix: str) -> None:
        """One problem, as `option=value rule; fix.`"""
        self.report(Problem(option, value, rule, fix))

    def report(self, *found: Problem | None) -> None:
        """Problems a rule written elsewhere found (None: it holds)."""
        self.messages.extend(str(problem) for problem in found if problem is not None)

    def note(self, message: str) -> None:
        self.messages.append(message)

    def raise_if_any(self, where: str = "the config") -> None:
        if len(self.messages) == 1:
            raise ConfigError(self.messages[0])
        if self.messages:
            listed = "\n".join(f"  - {message}" for message in self.messages)
            raise ConfigError(f"{len(self.messages)} problems in {where}:\n{listed}")


def _default(cls, name: str):
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
    return None


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
            default, choices = _default(type(part), name), choices_of(type(part)).get(name)
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
    if model.num_layers_unfrozen != _default(type(model), "num_layers_unfrozen"):
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
    if fsdp and _launched_processes() <= 1:
        _warn_once(
            "train.fsdp_trunk=true shards the frozen trunk over the processes of a torchrun / accelerate launch "
            "run; this run has one process, so the trunk stays whole."
        )


def _launched_processes() -> int:
    """WORLD_SIZE as a launcher (torchrun, accelerate launch) set it; 1 without one."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1") or 1))
    except ValueError:
        return 1


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


def _check_ppo(config: Config, problems: Problems) -> None:
    """`hydrappo train`'s own rules, by what they are about."""
    ppo, gen, reward = config.ppo, config.generation, config.reward
    _check_batches(ppo, gen.samples_per_prompt, problems)
    if ppo.advantage_estimator in ESTIMATORS:
        problems.report(group_size_problem(ppo.advantage_estimator, gen.samples_per_prompt))
    if config.model.value_head_init == "reward_head" and not (config.model.reward_branch_path and ppo.uses_critic):
        problems.add(
            "model.value_head_init",
            "reward_head",
            "copies the reward head into the value head, so it needs "
            "model.reward_branch_path and ppo.advantage_estimator: gae",
            "set model.reward_branch_path, or use value_head_init: random",
        )
    if ppo.critic_warmup_steps > 0 and not ppo.uses_critic:
        problems.add(
            "ppo.critic_warmup_steps",
            ppo.critic_warmup_steps,
            f"warms up a value head, and ppo.advantage_estimator={ppo.advantage_estimator} has none",
            "use critic_warmup_steps: 0, or advantage_estimator: gae",
        )
    if reward.overlong_buffer > gen.max_new_tokens >= 1:
        problems.add(
            "reward.overlong_buffer",
            reward.overlong_buffer,
            f"must be <= generation.max_new_tokens "
            f"({gen.max_new_tokens}): the penalty starts that many tokens before the limit",
            f"use e.g. {max(1, gen.max_new_tokens // 4)}",
        )
    _check_generation(config, problems)
    _check_kl_controller(ppo, problems)
    check_reward_sources(config, problems)
    check_task(config, problems)  # a reasoning-gym task: the prompts, held-out items and a reward source
    _check_evaluation(config, problems)
    if not has_prompts(config):
        problems.add(
            "data.prompts",
            None,
            "is required",
            "name a jsonl/json/csv/parquet/txt file, a directory of them or a datasets name (or set task.task_name)",
        )


def _check_batches(ppo: PPOArgs, group: int, problems: Problems) -> None:
    """How a batch of `group` samples per prompt divides into minibatches, micro-batches and processes."""
    if ppo.batch_size >= 1 and ppo.mini_batch_size >= 1 and ppo.batch_size % ppo.mini_batch_size:
        problems.add(
            "ppo.mini_batch_size",
            ppo.mini_batch_size,
            f"must divide ppo.batch_size ({ppo.batch_size}): "
            f"ppo.batch_size ({ppo.batch_size}) must be a multiple of mini_batch_size ({ppo.mini_batch_size})",
            f"use a divisor of {ppo.batch_size}, e.g. {_divisor(ppo.batch_size, ppo.mini_batch_size)}",
        )
    if (
        ppo.mini_batch_size >= 1
        and ppo.gradient_accumulation_steps >= 1
        and ppo.mini_batch_size % ppo.gradient_accumulation_steps
    ):
        problems.add(
            "ppo.gradient_accumulation_steps",
            ppo.gradient_accumulation_steps,
            f"must divide ppo.mini_batch_size ({ppo.mini_batch_size}): ppo.mini_batch_size ({ppo.mini_batch_size}) "
            f"must be a multiple of gradient_accumulation_steps ({ppo.gradient_accumulation_steps})",
            f"use a divisor of {ppo.mini_batch_size}, e.g. 1",
        )
    if group >= 1 and ppo.batch_size >= 1 and ppo.batch_size % group:
        problems.add(
            "ppo.batch_size",
            ppo.batch_size,
            f"counts responses and must be divisible by generation.samples_per_prompt ({group})",
            f"set batch_size to a multiple of {group}",
        )
    processes = _launched_processes()
    check_process_shares(ppo, group, processes, problems, f"the {processes} processes of this launch (WORLD_SIZE)")


def _check_generation(config: Config, problems: Problems) -> None:
    """The sampler and the response lengths it is given."""
    gen = config.generation
    if gen.min_new_tokens > gen.max_new_tokens >= 1:
        problems.add(
            "generation.min_new_tokens",
            gen.min_new_tokens,
            f"must be <= generation.max_new_tokens ({gen.max_new_tokens})",
            f"use at most {gen.max_new_tokens}",
        )
    if gen.sampler == "continuous_batching" and gen.min_new_tokens > 0:
        problems.add(
            "generation.min_new_tokens",
            gen.min_new_tokens,
            "has no continuous-batching version in "
            "transformers (generation.sampler: continuous_batching would drop it)",
            "set min_new_tokens: 0, or sampler: decode or generate",
        )
    if gen.sampler in ("continuous_batching", "decode", "graph") and config.train.fsdp_trunk:
        problems.add(
            "generation.sampler",
            gen.sampler,
            "cannot run a trunk sharded over processes "
            "(train.fsdp_trunk: every process must run every token step in lockstep)",
            "use sampler: generate (or auto), or fsdp_trunk: false",
        )
    if gen.sampler == "vllm":
        _check_serving_engine(config, problems)
    elif gen.engine_gpu_memory != _default(GenerationArgs, "engine_gpu_memory"):
        problems.add(
            "generation.engine_gpu_memory",
            gen.engine_gpu_memory,
            f"only sizes the engine of sampler: vllm, and generation.sampler is {gen.sampler!r}",
            "set sampler: vllm, or remove engine_gpu_memory",
        )


def _check_kl_controller(ppo: PPOArgs, problems: Problems) -> None:
    """Options of one KL controller given to another."""
    if ppo.kl_controller == "fixed":
        for name in ("kl_target", "kl_horizon"):
            value = getattr(ppo, name)
            if value != _default(PPOArgs, name):
                problems.add(
                    f"ppo.{name}",
                    value,
                    "only steers the adaptive KL controller, and ppo.kl_controller is "
                    "'fixed' (the coefficient stays init_kl_coef)",
                    f"set kl_controller: adaptive, or remove {name}",
                )
    steered = {"kl_horizon": "adaptive", **dict.fromkeys(("kl_pi_kp", "kl_pi_ki", "kl_pi_integral_min"), "pi")}
    for name, user in steered.items():
        value = getattr(ppo, name)
        reported = name == "kl_horizon" and ppo.kl_controller == "fixed"  # above
        if ppo.kl_controller != user and value != _default(PPOArgs, name) and not reported:
            problems.add(
                f"ppo.{name}",
                value,
                f"only steers the {user} KL controller, and ppo.kl_controller is {ppo.kl_controller!r}",
                f"set kl_controller: {user}, or remove {name}",
            )
    if ppo.kl_controller == "pi" and ppo.init_kl_coef == 0:
        problems.add(
            "ppo.init_kl_coef",
            0,
            "cannot start the pi KL controller, which scales beta by factors (0 stays 0)",
            "use e.g. 0.05, or kl_controller: fixed for no KL term",
        )


def _check_evaluation(config: Config, problems: Problems) -> None:
    """The held-out evaluation's options, which need held-out prompts (data.eval_prompts or a task's)."""
    if held_out_off(config):  # --eval_prompts "": the file's eval_* options no longer apply
        return
    if config.train.eval_every > 0 and not has_held_out(config):
        problems.add(
            "train.eval_every",
            config.train.eval_every,
            "has nothing to evaluate without data.eval_prompts (or task.task_eval_size)",
            "set data.eval_prompts to a held-out prompts file or datasets name, or remove eval_every",
        )
    if config.train.eval_samples_per_prompt > 1 and not has_held_out(config):
        problems.add(
            "train.eval_samples_per_prompt",
            config.train.eval_samples_per_prompt,
            "has nothing to evaluate without data.eval_prompts",
            "set data.eval_prompts to a held-out prompts file or datasets name, or remove eval_samples_per_prompt",
        )
    elif config.train.eval_samples_per_prompt > 1 and config.train.eval_greedy:
        problems.add(
            "train.eval_samples_per_prompt",
            config.train.eval_samples_per_prompt,
            "needs sampled answers: greedy answers to a prompt are all the same",
            "set train.eval_greedy: false to sample several answers per prompt, or use eval_samples_per_prompt: 1",
        )
    if config.data.eval_prompts and config.train.fsdp_trunk:
        problems.add(
            "data.eval_prompts",
            config.data.eval_prompts,
            "is not supported with train.fsdp_trunk yet (a "
            "sharded trunk generates in lockstep, and the processes hold different numbers of held-out batches)",
            "evaluate the checkpoints afterwards with `hydrappo generate`, or train without fsdp_trunk",
        )


def _check_serving_engine(config: Config, problems: Problems) -> None:
    """generation.sampler: vllm, an engine in each process holding its own whole copy of the model on a GPU
    (generation/serving.py): not where the trunk is sharded or quantized to save that memory, nor without CUDA or vLLM."""
    model, train = config.model, config.train
    if train.fsdp_trunk:
        problems.add(
            "generation.sampler",
            "vllm",
            "cannot serve a trunk sharded over processes (train.fsdp_trunk): the "
            "engine holds a whole copy of the model in every process, the memory sharding is there to save",
            "use sampler: auto (generate), or fsdp_trunk: false",
        )
    if model.trunk_quantization in TRUNK_QUANTIZATIONS[1:]:
        problems.add(
            "generation.sampler",
            "vllm",
            f"cannot sample from model.trunk_quantization={model.trunk_quantization!r}'s "
            "trunk: bitsandbytes' quantized bottom has no vLLM counterpart with the same numbers, and a "
            "full-precision copy in the engine would take back the memory the quantization saves",
            "use sampler: auto (generate), or trunk_quantization: none",
        )
    device = train.device
    if device in ("cpu", "mps") or (device in ("auto", "cuda") and not _cuda_available()):
        where = f"train.device={device}" + ("" if device in ("cpu", "mps") else ", and no CUDA device is visible")
        problems.add(
            "generation.sampler",
            "vllm",
            f"runs vLLM's engine on a CUDA GPU, and this run has none ({where})",
            "use sampler: auto here (the decode loop on a CPU)",
        )
    if not _vllm_installed():
        problems.note(
            "generation.sampler='vllm': needs vLLM, which is not installed. Run `pip install 'hydrappo[vllm]'` "
            "(vLLM 0.29 to 0.32, the releases built for torch 2.13), or use sampler: auto."
        )


def _vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def _cuda_available() -> bool:
    return torch.cuda.is_available()


def check_process_shares(ppo, group: int, processes: int, problems: Problems, who: str) -> None:
    """The rule of a batch that `processes` processes share (`who` names them): whole prompts each,
    and whole micro-batches of every minibatch. Checked before anything loads from the launcher's
    WORLD_SIZE, and by the PPO trainer with the process group it joined."""
    if (
        processes > 1
        and group >= 1
        and ppo.batch_size >= 1
        and not ppo.batch_size % group
        and (ppo.batch_size // group) % processes
    ):
        problems.add(
            "ppo.batch_size",
            ppo.batch_size,
            f"is {ppo.batch_size // group} prompts x {group} samples, which {who} cannot share in whole prompts",
            f"make the number of prompts per batch a multiple of {processes}, e.g. batch_size "
            f"{group * processes * max(1, round(ppo.batch_size / (group * processes)))}",
        )
    if (
        processes > 1
        and ppo.mini_batch_size >= 1
        and ppo.gradient_accumulation_steps >= 1
        and ppo.mini_batch_size % (processes * ppo.gradient_accumulation_steps)
    ):
        problems.add(
            "ppo.mini_batch_size",
            ppo.mini_batch_size,
            f"must be a multiple of {who} x "
            f"gradient_accumulation_steps ({ppo.gradient_accumulation_steps}): each process takes its share of "
            "every minibatch and splits it into micro-batches",
            f"use a multiple of {processes * ppo.gradient_accumulation_steps}",
        )


def _divisor(total: int, near: int) -> int:
    divisors = [d for d in range(1, total + 1) if total % d == 0]
    return min(divisors, key=lambda d: (abs(d - near), d))


def _warn_sampling(config) -> None:
    """What is legal but probably not meant: said once per process."""
    gen = getattr(config, "generation", None)
    if gen is not None and (gen.top_p < 1.0 or gen.top_k > 0):
        _warn_once(
            f"generation.top_p={gen.top_p}, top_k={gen.top_k}: responses are sampled from a truncated distribution, but "
            "PPO's log-probs, ratios and KL use the full one, so the updates are slightly off-policy. Use top_p: 1.0 and "
            "top_k: 0 unless you mean it."
        )


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning(message)


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
        _warn_once(
            "dpo with every layer training (model.num_layers_unfrozen: -1) keeps a frozen copy of the whole model as "
            "its reference: twice the model's memory. A band, the top layers or LoRA share the frozen layers instead."
        )


# Each command's own rules, by its config class (a new stage adds a row); validate runs the
# rules every config shares before them.
OWN_RULES = {
    Config: _check_ppo,
    RewardConfig: _check_reward_stage,
    SFTConfig: _check_sft_stage,
    DPOConfig: _check_dpo_stage,
}
