"""The trainers built from Python objects, the way TRL users write them.

    trainer = PPOTrainer(model="HuggingFaceTB/SmolLM2-135M-Instruct",
                         reward_funcs=[accuracy, format_ok], reward_weights=[1.0, 0.2],
                         train_dataset=Dataset.from_list(rows), eval_dataset=held_out,
                         args={"ppo": {"batch_size": 16}, "train": {"total_steps": 50}})
    trainer.train()
    trainer.save_model("policy")   # a plain transformers model folder

Every object lands in the same `Config` fields the YAML file sets, and the trainer checks that
config with the same rules (config/checks.py) before any model loads; only the objects
themselves (a loaded model, function objects, in-memory tables) skip the file-path checks.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

from ..config import ConfigError, names_run_tokenizer
from ..config.parse import parse_config
from ..errors import UsageError


def config_of(config_cls, args) -> object:
    """A `config_cls` from `args`: an instance (copied), a YAML file path, a mapping in the YAML
    file's shape ({section: {option: value}}) or None (the defaults)."""
    if isinstance(args, config_cls):
        return copy.deepcopy(args)
    if args is None or isinstance(args, (str, os.PathLike, dict)):
        path = args if isinstance(args, (str, os.PathLike)) else None
        return parse_config(path, [], config_cls, data=args if isinstance(args, dict) else None, check=False)
    raise ConfigError(
        f"args: a {type(args).__name__} is not a {config_cls.__name__}; give a {config_cls.__name__}, a YAML config path "
        "or a dict shaped like the YAML file ({'ppo': {'batch_size': 16}, ...})."
    )


def apply_objects(
    config,
    *,
    model=None,
    reward_funcs=None,
    reward_weights=None,
    train_dataset=None,
    eval_dataset=None,
    tools=None,
    environment_factory=None,
):
    """Put the objects into `config` (in place). Returns the loaded model to wrap (a
    `PreTrainedModel` given as `model`) or None."""
    loaded = None
    if model is not None:
        if isinstance(model, (str, os.PathLike)):
            config.model.name_or_path = str(model)
        elif hasattr(model, "config") and hasattr(model, "generate"):  # a transformers PreTrainedModel
            loaded = model
            config.model.name_or_path = (
                getattr(model, "name_or_path", "") or config.model.name_or_path or "(given model)"
            )
        else:
            raise ConfigError(
                f"model: a {type(model).__name__} is not a model; give a model id, a path or a transformers "
                "PreTrainedModel."
            )
    if reward_funcs is not None:
        if not hasattr(config, "reward"):
            raise ConfigError(
                f"reward_funcs: {type(config).__name__} has no reward section; reward functions are for RL."
            )
        funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        config.reward.reward_fn = funcs
    if reward_weights is not None:
        config.reward.reward_weights = [float(w) for w in reward_weights]
    if tools is not None or environment_factory is not None:  # TRL's agent objects: multi-turn episodes
        if not hasattr(config, "agent"):
            raise ConfigError(
                f"tools / environment_factory: {type(config).__name__} has no agent section; they are for RL."
            )
        if tools is not None:
            config.agent.tools = list(tools) if isinstance(tools, (list, tuple)) else [tools]
        if environment_factory is not None:
            config.agent.environment_factory = environment_factory
    train_field, eval_field = config.DATASETS  # where train_dataset / eval_dataset go
    for field, table in ((train_field, train_dataset), (eval_field, eval_dataset)):
        if table is not None:
            setattr(config.data, field, str(table) if isinstance(table, Path) else table)
    return loaded


def save_model(hydra, tokenizer, output_dir) -> Path:
    """The trained policy as a plain transformers model folder (LoRA adapters merged), which
    `AutoModelForCausalLM.from_pretrained(output_dir)` loads."""
    from ..storage.export import policy_model, save_model_dir

    model = policy_model(hydra)
    saved_name = model.config.name_or_path
    model.config.name_or_path = ""
    try:
        return save_model_dir(model, tokenizer, output_dir)
    finally:
        model.config.name_or_path = saved_name


OBJECTS = (
    "model",
    "reward_funcs",
    "reward_weights",
    "train_dataset",
    "eval_dataset",
    "tools",
    "environment_factory",
    "args",
    "processing_class",
    "task",  # a reasoning-gym task (tasks/): the prompts, held-out items and a reward source
)


def trainer_inputs(config_cls, config, objects: dict, tokenizer=None) -> tuple[object, object, object]:
    """(config, loaded model or None, tokenizer) of a trainer built as `Trainer(config)` (the
    config as it is) or from objects (OBJECTS, TRL's names: `Trainer(model, reward_funcs=...,
    train_dataset=..., args=...)`; a model given first in TRL's order is taken as `model`)."""
    unknown = sorted(set(objects) - set(OBJECTS))
    if unknown:
        raise ConfigError(
            f"unknown argument(s) {', '.join(unknown)}; the trainers take {', '.join(OBJECTS)} (or a config)."
        )
    if config is not None and not isinstance(config, config_cls):
        if "model" in objects:
            raise ConfigError(f"a {type(config).__name__} was given first and as model=: give the model once.")
        objects = {**objects, "model": config}  # TRL's order: the model first
        config = None
    if config is None:
        config = config_of(config_cls, objects.get("args"))
    elif objects.get("args") is not None:
        raise ConfigError("give the config either first or as args=, not both.")
    elif any(objects.get(name) is not None for name in OBJECTS):
        config = copy.deepcopy(config)
    loaded = apply_objects(config, **{name: objects.get(name) for name in OBJECTS[:7]})
    if objects.get("task") is not None:  # it fills the config's task section, which the run records
        objects["task"].configure(config)
    return config, loaded, tokenizer if tokenizer is not None else objects.get("processing_class")


def check_processing_class(config, inputs, tokenizer, option: str = "processing_class") -> None:
    """Refuse, before any model loads, a tokenizer given in Python that cannot serve this run: not a
    tokenizer, given besides model.tokenizer_name_or_path (unless that names the folder where this run saves
    the tokenizer it was given: storage/run_tokenizer.py), or without the chat template the run
    renders prompts or turns with. (Its vocabulary is checked against the model once that is
    loaded: storage/models.check_tokenizer_fits.)"""
    from transformers import PreTrainedTokenizerBase

    if not isinstance(tokenizer, PreTrainedTokenizerBase):
        inner = getattr(tokenizer, "tokenizer", None)
        hint = f" (a processor: give its tokenizer, {option}=processor.tokenizer)" if inner is not None else ""
        raise UsageError(
            f"{option}: a {type(tokenizer).__name__} is not a transformers tokenizer{hint}; give a tokenizer "
            "(AutoTokenizer.from_pretrained(...)), or leave it out to use the model's own."
        )
    if config.model.tokenizer_name_or_path and not names_run_tokenizer(config):  # (that run's own: the same again)
        raise ConfigError(
            f"{option} and model.tokenizer_name_or_path={config.model.tokenizer_name_or_path!r} both name the "
            "tokenizer: give one of them."
        )
    if getattr(tokenizer, "chat_template", None):
        return
    needs = chat_template_needs(config, inputs)
    if needs:
        raise UsageError(
            f"{option}: the tokenizer has no chat template, and {needs}; give a tokenizer with one (set "
            "tokenizer.chat_template to a Jinja template, or load the tokenizer of an instruct model)."
        )


def chat_template_needs(config, inputs) -> str | None:
    """Why this run renders text with the tokenizer's chat template (None: it does not). A reasoning-gym
    task does not need one: without it, its prompts are plain text (tasks/reasoning_gym.py plain_prompts)."""
    agent = getattr(config, "agent", None)
    if agent is not None and agent.enabled:
        return "multi-turn episodes (the agent section, or tools= / environment_factory=) render every turn with it"
    task = getattr(config, "task", None)
    if task is not None and task.enabled:
        return None
    if config.data.apply_chat_template:
        return "data.apply_chat_template is set"
    for where, prompts in prompt_lists(config, inputs):
        if any(isinstance(prompt, (list, tuple)) for prompt in prompts or ()):
            return f"the prompts of {where} are message lists, which only a chat template turns into text"
    return None


def refuse_without_chat_template(config, inputs) -> None:
    """Refuse, before any weights load or any GGUF file is converted, a run that renders text with the
    chat template when the tokenizer the config names has none (a base model): read from the GGUF
    file's metadata or the tokenizer's files (storage/gguf_metadata.py)."""
    from ..storage.gguf_metadata import source_chat_template

    needs = chat_template_needs(config, inputs)
    if not needs or source_chat_template(config.model):
        return
    model = config.model
    named = (
        f"model.tokenizer_name_or_path={model.tokenizer_name_or_path!r}"
        if model.tokenizer_name_or_path
        else f"model.name_or_path={model.name_or_path!r}"
    )
    raise UsageError(
        f"{named} has no chat template (a base model's tokenizer has none), and {needs}. Give the prompts as plain "
        "text (data.apply_chat_template: false; a reasoning-gym task renders its prompts as plain text by itself), "
        "or a tokenizer with a chat template (model.tokenizer_name_or_path, e.g. the instruct model's)."
    )


def prompt_lists(config, inputs) -> list[tuple[str, list]]:
    """(where, prompts) of each table a stage reads prompts from."""
    if hasattr(inputs, "prompts"):  # RL: train/inputs.RLInputs
        return [
            ("data.prompts (train_dataset)", inputs.prompts),
            ("data.eval_prompts (eval_dataset)", inputs.eval_prompts),
        ]
    column = getattr(config.data, "prompt_column", None) or "prompt"
    tables = [
        ("data.train_file (train_dataset)", inputs.train),
        ("data.eval_file (eval_dataset)", inputs.eval),
        ("data.stats_file", inputs.stats),
    ]
    return [(where, table.get(column)) for where, table in tables if table]
