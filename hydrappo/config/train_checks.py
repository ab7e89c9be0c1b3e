"""`hydrappo train`'s own rules: how a batch divides, the sampler, the KL controller, the held-out
evaluation and the vLLM serving engine. Part of config/checks.py's one pass; the reward sources'
rules are config/reward_sources.py's, a reasoning-gym task's config/task.py's."""

from __future__ import annotations

import importlib.util

import torch

from ..algo.advantages import ESTIMATORS, group_size_problem
from ..model.quantize import TRUNK_QUANTIZATIONS
from .options import GenerationArgs, PPOArgs
from .problems import Problems, default_of, launched_processes
from .reward_sources import check_reward_sources
from .sections import Config
from .task import check_task, has_held_out, has_prompts, held_out_off


def check_train(config: Config, problems: Problems) -> None:
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
    processes = launched_processes()
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
    elif gen.engine_gpu_memory != default_of(GenerationArgs, "engine_gpu_memory"):
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
            if value != default_of(PPOArgs, name):
                problems.add(
                    f"ppo.{name}",
                    value,
                    "only steers the adaptive KL controller, and ppo.kl_controller is "
                    "'fixed' (the coefficient stays init_kl_coef)",
                    f"set kl_controller: adaptive, or remove {name}",
                )
    steered = {
        "kl_horizon": "adaptive",
        "kl_pi_kp": "pi",
        "kl_pi_ki": "pi",
        "kl_pi_integral_min": "pi",
    }
    for name, user in steered.items():
        value = getattr(ppo, name)
        reported = name == "kl_horizon" and ppo.kl_controller == "fixed"  # above
        if ppo.kl_controller != user and value != default_of(PPOArgs, name) and not reported:
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
