"""One config per command: which sections `hydrappo train`, `hydrappo reward` and `hydrappo sft`
read (options.py, stage_options.py, agent.py), their dict form and path anchoring, and the
tables of sections the parser and the checks walk.

`hydrappo train` reads `model:`, `lora:`, `generation:`, `ppo:`, `reward:`, `data:`, `train:`,
`agent:` and `task:`; `hydrappo reward` reads `model:`, `data:` and `train:`; `hydrappo sft` reads `model:`,
`lora:`, `data:` and `train:`; `hydrappo dpo` reads `model:`, `lora:`, `data:`, `train:` and `dpo:`.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from .agent import AgentArgs
from .options import (
    DataArgs,
    GenerationArgs,
    LoraArgs,
    ModelConfig,
    PPOArgs,
    RewardArgs,
    TrainArgs,
    _plain,
    resolve_path,
)
from .stage_options import (
    DPOArgs,
    DPODataArgs,
    DPOTrainArgs,
    PreferenceDataArgs,
    RewardTrainArgs,
    SFTDataArgs,
    SFTTrainArgs,
)
from .task import TaskArgs


# --------------------------------------------------------------------------- one config per command
class _Sections:
    """What the three config containers share: a dict form, and path anchoring. Each declares
    what the code around it reads instead of asking which command it is:"""

    PATHS: tuple[str, ...] = ()  # "section.field" entries that hold input paths
    config_file: str | None = None  # the YAML file it was read from (parse_config sets it); not an option
    OPTIMIZER = "train"  # the section holding the optimizer options (OptimizerArgs)
    DATASETS = ("train_file", "eval_file")  # the data options train_dataset / eval_dataset fill (train/api.py)
    SEEDED_DATA = True  # train.seed draws the held-out split and the batches (a resume must keep it)

    def to_dict(self) -> dict:
        """The options as plain data, what a run's config.yaml records: a function object given
        through the Python API as 'module:qualname', an in-memory table as a note of its size."""
        return {
            part.name: {
                option.name: _plain(getattr(getattr(self, part.name), option.name))
                for option in dataclasses.fields(getattr(self, part.name))
            }
            for part in dataclasses.fields(self)
        }

    def resolve_paths(self, base_dir: str | Path | None) -> None:
        """Anchor every relative input path at `base_dir` (a config file's folder), in
        place, so that the config saved with each checkpoint works from any directory."""
        if base_dir is None:
            return
        for entry in self.PATHS:
            section, name = entry.split(".")
            part = getattr(self, section, None)
            if part is not None and hasattr(part, name):
                setattr(part, name, resolve_path(getattr(part, name), Path(base_dir)))
        reward = getattr(self, "reward", None)
        if reward is not None and reward.reward_fn:
            specs = []
            for spec in reward.function_specs:
                if isinstance(spec, str) and ".py:" in spec:
                    file, _, function = spec.rpartition(":")
                    spec = f"{resolve_path(file, Path(base_dir))}:{function}"
                specs.append(spec)
            reward.reward_fn = specs if isinstance(reward.reward_fn, (list, tuple)) else ",".join(specs)


_MODEL_PATHS = (
    "model.name_or_path",
    "model.tokenizer_name_or_path",
    "model.reward_branch_path",
    "lora.lora_init_adapter",
)


@dataclass
class Config(_Sections):
    """`hydrappo train`: PPO."""

    PATHS = (*_MODEL_PATHS, "reward.reward_model", "data.prompts", "data.eval_prompts")
    OPTIMIZER, DATASETS, SEEDED_DATA = "ppo", ("prompts", "eval_prompts"), False
    model: ModelConfig = field(default_factory=ModelConfig)
    generation: GenerationArgs = field(default_factory=GenerationArgs)
    ppo: PPOArgs = field(default_factory=PPOArgs)
    reward: RewardArgs = field(default_factory=RewardArgs)
    data: DataArgs = field(default_factory=DataArgs)
    train: TrainArgs = field(default_factory=TrainArgs)
    lora: LoraArgs = field(default_factory=LoraArgs)
    agent: AgentArgs = field(default_factory=AgentArgs)  # multi-turn episodes with tools (config/agent.py)
    task: TaskArgs = field(default_factory=TaskArgs)  # a reasoning-gym task as prompts and reward (config/task.py)


_STAGE_DATA_PATHS = ("data.train_file", "data.eval_file", "data.stats_file")


@dataclass
class RewardConfig(_Sections):
    """`hydrappo reward`: a reward branch from preference pairs."""

    PATHS = (*_MODEL_PATHS, *_STAGE_DATA_PATHS)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: PreferenceDataArgs = field(default_factory=PreferenceDataArgs)
    train: RewardTrainArgs = field(default_factory=RewardTrainArgs)


@dataclass
class SFTConfig(_Sections):
    """`hydrappo sft`: supervised fine-tuning of the top layers (or LoRA adapters)."""

    PATHS = (*_MODEL_PATHS, *_STAGE_DATA_PATHS)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: SFTDataArgs = field(default_factory=SFTDataArgs)
    train: SFTTrainArgs = field(default_factory=SFTTrainArgs)
    lora: LoraArgs = field(default_factory=LoraArgs)


@dataclass
class DPOConfig(_Sections):
    """`hydrappo dpo`: the policy (the top layers, a band, or LoRA adapters) from preference pairs, the
    reference being the frozen copy of what trains (train/dpo.py)."""

    PATHS = (*_MODEL_PATHS, "data.train_file", "data.eval_file")
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DPODataArgs = field(default_factory=DPODataArgs)
    train: DPOTrainArgs = field(default_factory=DPOTrainArgs)
    dpo: DPOArgs = field(default_factory=DPOArgs)
    lora: LoraArgs = field(default_factory=LoraArgs)


@functools.cache
def choices_of(section_cls) -> dict[str, tuple]:
    """{option: its words} of a section's `Literal[...]` options (read from the annotations:
    argument parsers rewrite `dataclasses.fields(...).type` in place)."""
    hints = typing.get_type_hints(section_cls)
    return {
        f.name: typing.get_args(hints[f.name])
        for f in dataclasses.fields(section_cls)
        if typing.get_origin(hints[f.name]) is Literal
    }


def sections_of(config_cls) -> dict:
    """{section name: dataclass} of a config container class."""
    return {f.name: f.type if isinstance(f.type, type) else f.default_factory for f in dataclasses.fields(config_cls)}


SECTIONS = sections_of(Config)
REWARD_SECTIONS = sections_of(RewardConfig)
SFT_SECTIONS = sections_of(SFTConfig)
DPO_SECTIONS = sections_of(DPOConfig)


def _check_unique_field_names(sections: dict) -> None:
    seen = {}
    for section, cls in sections.items():
        for f in dataclasses.fields(cls):
            if f.name in seen:
                raise AssertionError(f"field {f.name!r} is in both {seen[f.name]} and {section}")
            seen[f.name] = section


for _sections in (SECTIONS, REWARD_SECTIONS, SFT_SECTIONS, DPO_SECTIONS):
    _check_unique_field_names(_sections)
