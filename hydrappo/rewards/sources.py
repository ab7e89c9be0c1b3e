"""Reward sources behind one interface, and the weighted sum of several.

A reward source is a callable
    source(samples, prompts, outputs, step=None, *, columns=None, completion_ids=None, branch_scores=None)
returning float32 scores of shape (B,), where `samples[i] == prompts[i] + outputs[i]`,
`columns` maps each dataset column other than the prompt to its B row-aligned values and
`branch_scores` are the reward branch's scores from the policy's own forward pass. Kinds:

- `FunctionReward` (rewards/functions.py): a user's Python function, in trlX's or TRL's convention.
- `ClassifierReward` (rewards/models.py): an `AutoModelForSequenceClassification` directory or Hub id.
- `BranchReward` (rewards/models.py): the hydra reward branch (`reward.use_reward_branch`).
- `RewardSources`: any of them together, scored as a weighted sum into `RewardScores` (the total
  and each source's own scores); `build_reward_source` always returns one, with one entry per
  source the config names (`reward_source_names`).

Each kind is a class in SOURCE_CLASSES under its `kind`, the name of its row in
config/reward_sources.py's SOURCE_KINDS (which options name it): a new kind is a class, an entry
below and a row there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..config.reward_sources import NO_REWARD_SOURCE, reward_source_names, weights_problem
from ..errors import RewardError
from ..model.heads import widened
from .calls import await_together
from .functions import FunctionReward, reward_functions
from .models import BranchReward, ClassifierReward

# kind (a row of config/reward_sources.py's SOURCE_KINDS) -> its class. build_reward_source makes
# each source a config names with `cls.build(what, reward_args, base_dir=, device=, functions=)`, and
# logs its scores under the source's `name`.
SOURCE_CLASSES: dict[str, type] = {cls.kind: cls for cls in (FunctionReward, ClassifierReward, BranchReward)}


@dataclass
class RewardScores:
    """What the reward sources give one batch: the weighted sum, and each source's own scores."""

    total: torch.Tensor  # (B,) sum_k weight_k * score_k; NaN where no source scored the sample
    parts: dict[str, torch.Tensor]  # source name -> its (B,) unweighted scores, NaN where it gave None


class RewardSources:
    """Several reward sources as one: the score is sum_k weight_k * score_k (TRL's
    reward_weights), with each source's own scores beside it (`RewardScores`)."""

    def __init__(self, entries: list[tuple[str, float, object]]):
        if not entries:
            raise RewardError(NO_REWARD_SOURCE)
        self.entries = entries

    @property
    def names(self) -> list[str]:
        return [name for name, _, _ in self.entries]

    def __call__(self, samples, prompts=None, outputs=None, step: int | None = None, **inputs) -> RewardScores:
        """A sample a source returned None for (NaN) counts 0 in the sum, as in TRL (nansum); one no source
        scored is NaN: unscored."""
        results = {
            name: source(samples, prompts, outputs, step=step, defer=True, **inputs) for name, _, source in self.entries
        }
        pending = {name: result for name, result in results.items() if isinstance(result, tuple)}
        for (name, (_, finish)), value in zip(pending.items(), await_together([p for p, _ in pending.values()])):
            results[name] = finish(value)
        parts = {name: widened(torch.as_tensor(results[name])) for name, _, _ in self.entries}
        total = sum(
            weight * parts[name].nan_to_num(0.0) for name, weight, _ in self.entries
        )  # 1.0 * x, 0 + x: x exactly
        unscored = torch.stack([part.isnan() for part in parts.values()]).all(0)
        return RewardScores(total=total.masked_fill(unscored, float("nan")), parts=parts)


def build_reward_source(
    reward_args,
    base_dir: str | Path | None = None,
    device: str = "cpu",
    columns=None,
    functions: list[FunctionReward] | None = None,
    shared_weight_sources=(),
) -> RewardSources:
    """Every reward source `RewardArgs` names (`reward_source_names`), weighted by
    reward.reward_weights (1 each by default), as one RewardSources. `functions` are ones
    `reward_functions` already loaded. `shared_weight_sources` are sources that come with the data,
    loaded already (a task's verifiers, tasks/): together one more source, the last, whose one
    weight each of them takes, each logged under its own name."""
    sources = reward_source_names(reward_args)
    functions = list(functions) if functions is not None else reward_functions(reward_args, base_dir, columns)
    shared = list(shared_weight_sources)
    count = len(sources) + bool(shared)
    if not count:
        raise RewardError(NO_REWARD_SOURCE)
    weights = getattr(reward_args, "reward_weights", None) or None  # none or an empty list: 1 each
    if (problem := weights_problem(weights, count)) is not None:
        raise RewardError(str(problem))
    weights = list(weights or [1.0] * count)
    weights += [weights[-1]] * (len(shared) - 1)  # the last weight, once for each shared source
    made = [
        SOURCE_CLASSES[kind].build(what, reward_args, base_dir=base_dir, device=device, functions=functions)
        for kind, what in sources
    ]
    entries, used = [], set()
    for source, weight in zip(made + shared, weights):
        unique, n = source.name, 2
        while unique in used:
            unique, n = f"{source.name}_{n}", n + 1
        used.add(unique)
        entries.append((unique, float(weight), source))
    return RewardSources(entries)
