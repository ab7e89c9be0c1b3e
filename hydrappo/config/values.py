"""What an option's value may be, declared with the option in config/options.py: the words of a
`Literal[...]` type, or a `Range` in the field's metadata (`option(default, help, Range(...))`, its "range").
config/checks.py reads both from the fields and reports every value outside them at once."""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass
from typing import Literal

from ..algo.advantages import ADVANTAGE_ESTIMATORS, ESTIMATORS
from ..algo.ensemble import ENSEMBLE_OBJECTIVES
from ..algo.kl import KL_CONTROLLERS, KL_ESTIMATORS
from ..algo.losses import IMPORTANCE_SAMPLING_LEVELS, LOSS_AGG_MODES
from ..algo.scores import SCORE_NORMALIZATIONS
from ..model.heads import VALUE_HEAD_INITS
from ..model.reward_branch import REWARD_POOLINGS
from ..model.quantize import TRUNK_QUANTIZATIONS

# The options that take one of a few words are typed `Literal[...]` (HfArgumentParser lists the
# words in --help; config/checks.py reads them from the type). Where the words are the algo's or
# the model's own, the Literal is made from their tuple (`Literal[TUPLE]` is Literal of its items).
LrScheduler = Literal["constant", "linear", "cosine"]
MixedPrecision = Literal["auto", "no", "bf16", "fp16"]
KlPenalty = Literal["reward", "loss"]
LoraLayers = Literal["top", "all"]
Optimizer = Literal["adamw", "adamw8bit"]
Sampler = Literal["auto", "decode", "graph", "generate", "continuous_batching", "vllm"]
AdvantageEstimator = Literal[ADVANTAGE_ESTIMATORS]
KlController = Literal[KL_CONTROLLERS]
KlEstimator = Literal[KL_ESTIMATORS]
ImportanceSamplingLevel = Literal[IMPORTANCE_SAMPLING_LEVELS]
LossAggMode = Literal[LOSS_AGG_MODES]
ScoreNormalization = Literal[SCORE_NORMALIZATIONS]
ValueHeadInit = Literal[VALUE_HEAD_INITS]
RewardPooling = Literal[REWARD_POOLINGS]
EnsembleObjective = Literal[ENSEMBLE_OBJECTIVES]
TrunkQuantization = Literal[TRUNK_QUANTIZATIONS]
LR_SCHEDULERS = typing.get_args(LrScheduler)
MIXED_PRECISIONS = typing.get_args(MixedPrecision)
KL_PENALTIES = typing.get_args(KlPenalty)
LORA_LAYERS = typing.get_args(LoraLayers)
OPTIMIZERS = typing.get_args(Optimizer)
SAMPLERS = typing.get_args(Sampler)


def _names(rows) -> str:
    names = [row.name for row in rows]
    return " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


# ppo.advantage_estimator's help, from the estimators' table (algo/advantages.py ESTIMATORS).
ESTIMATOR_HELP = (
    f"{' | '.join(ESTIMATORS)}. With a value head (PPO): {_names(e for e in ESTIMATORS.values() if e.needs_critic)}; "
    "the others are critic-free (no value head is built). Needing generation.samples_per_prompt >= 2: "
    f"{_names(e for e in ESTIMATORS.values() if e.needs_groups)}."
)


@dataclass(frozen=True)
class Range:
    """`low <= value <= high` (strict where `*_open`); None bounds are unbounded. `fix` says
    what to set instead (default: the option's default value as an example). `past`, for a count
    whose `high` only catches typos (1e29 steps), says what a value above it would be."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    fix: str | None = None
    past: str | None = None

    def holds(self, value) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        return not self._below(value) and not self._above(value)

    def _below(self, value) -> bool:
        return self.low is not None and (value <= self.low if self.low_open else value < self.low)

    def _above(self, value) -> bool:
        return self.high is not None and (value >= self.high if self.high_open else value > self.high)

    def describe(self, value=None) -> str:
        """The rule `value` breaks (the whole rule without a value)."""
        if self.past is not None and value is not None and self._above(value):
            return f"must be at most {_num(self.high)}: more {self.past}"
        if self.past is not None and value is not None and self._below(value):
            return Range(self.low, low_open=self.low_open).describe()
        if self.low is not None and self.high is not None:
            return f"must be in {'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}{')' if self.high_open else ']'}"
        if self.low is not None:
            return f"must be {'>' if self.low_open else '>='} {_num(self.low)}"
        if self.high is not None:
            return f"must be {'<' if self.high_open else '<='} {_num(self.high)}"
        return "must be a finite number"


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


# Counts past these bounds are typos (1e29 steps, a response of 10^12 tokens), not runs: the check
# refuses them by name, where the run would otherwise start and promise what it cannot do.
MAX_STEPS = 10**7
MAX_ROWS = 2**20
MAX_TOKENS = 2**20
STEPS_PAST = "steps than a run takes (at one second a step, 10000000 steps are four months)"
ROWS_PAST = "than one step can hold at once"
TOKENS_PAST = "tokens than any model's context window holds"
MAX_LAYERS = 10**4
LAYERS_PAST = "layers than any model has"
ROLLOUTS_PAST = "rollouts than a run samples (its steps times its batch)"


def steps(low: int, fix: str | None = None) -> Range:
    """A count of steps (or of whole passes, each at least a step), from `low`."""
    return Range(low, MAX_STEPS, fix=fix, past=STEPS_PAST)


def rows(low: int, fix: str | None = None) -> Range:
    """A count of rows, samples or things held at once, from `low`."""
    return Range(low, MAX_ROWS, fix=fix, past=ROWS_PAST)


def tokens(low: int, fix: str | None = None) -> Range:
    """A count of tokens (or of ids in a vocabulary), from `low`."""
    return Range(low, MAX_TOKENS, fix=fix, past=TOKENS_PAST)


AT_LEAST_1 = Range(1)
NOT_NEGATIVE = Range(0)
POSITIVE = Range(0, low_open=True)
FINITE = Range()
UNIT = Range(0, 1)
