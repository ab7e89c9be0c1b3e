"""The reward section's rules for RL runs: which reward sources a config names, their weights,
and the options that only make sense with some of them. Part of config/checks.py's one pass."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import Problem


@dataclass(frozen=True)
class SourceKind:
    """One kind of reward source, as a reward section names it. rewards.py's class registered
    under the same `kind` builds it: adding a kind is that class and a row of SOURCE_KINDS."""

    kind: str
    named: Callable  # RewardArgs -> what of this kind the section names, in order (each becomes one source)
    how: str  # how to set it, for the message of a config that names no source
    order: str  # its place in reward.reward_weights


SOURCE_KINDS = (  # in the order of reward.reward_weights
    SourceKind(
        "function",
        lambda reward: list(reward.function_specs),
        "reward_fn ('module:function' or 'file.py:function', or a list of them)",
        "each reward_fn",
    ),
    SourceKind(
        "model",
        lambda reward: [reward.reward_model] if reward.reward_model else [],
        "reward_model (a sequence-classification model directory)",
        "reward_model",
    ),
    SourceKind(
        "branch",
        lambda reward: ["reward branch"] if reward.use_reward_branch else [],
        "use_reward_branch: true",
        "the reward branch",
    ),
)


def reward_source_names(reward) -> list[tuple[str, str]]:
    """[(kind, what)] of every source a reward section names, in the order of
    reward.reward_weights (SOURCE_KINDS' order).
    The one "which sources" rule: the checks below count it, rewards.build_reward_source builds it."""
    return [(row.kind, what) for row in SOURCE_KINDS for what in row.named(reward)]


# A task section (config/task.py) is one more source, the last: its tasks' verifiers, each task's
# scores logged apart (env/reward/<task>), share its one weight (rewards/sources.py).
SOURCE_ORDER = ", then ".join([*(row.order for row in SOURCE_KINDS), "the task"])  # of reward.reward_weights
_HOW = [row.how for row in SOURCE_KINDS]
NO_REWARD_SOURCE = (
    f"reward: no reward source is set. Set {', '.join(_HOW)} or a task (task.task_name); several combine as a "
    "weighted sum (reward_weights)."
)


def weights_problem(weights, sources: int) -> Problem | None:
    """reward.reward_weights gives one weight per source (None: 1 each): checked here and by
    rewards.build_reward_source."""
    if weights is None or len(weights) == sources:
        return None
    return Problem(
        "reward.reward_weights",
        list(weights),
        f"has {len(weights)} weight(s) for {sources} reward source(s) ({SOURCE_ORDER})",
        f"give {sources} weight(s), one per source in that order, or remove reward_weights (1 each)",
    )


def check_reward_sources(config, problems) -> None:
    """Problems of reward.reward_fn / reward_model / use_reward_branch, reward_weights, timeout_s and
    the reference score statistics, added to `problems` (config/problems.py's Problems)."""
    reward = config.reward
    task = getattr(config, "task", None)
    sources = len(reward_source_names(reward)) + bool(task is not None and task.enabled)
    if not sources:
        problems.note(NO_REWARD_SOURCE)
    if reward.reward_weights is not None:
        if (problem := weights_problem(reward.reward_weights, sources)) is not None:
            problems.report(problem)
        elif not all(math.isfinite(w) for w in reward.reward_weights):
            problems.add(
                "reward.reward_weights", list(reward.reward_weights), "must be finite numbers", "use finite weights"
            )
    if reward.use_reward_branch and not config.model.reward_branch_path:
        problems.add(
            "reward.use_reward_branch",
            True,
            "needs model.reward_branch_path (a `hydrappo reward` checkpoint)",
            "set model.reward_branch_path to the reward run's output_dir or one of its checkpoints",
        )
    if reward.timeout_s is not None and not reward.reward_fn:
        problems.add(
            "reward.timeout_s",
            reward.timeout_s,
            "limits calls of reward.reward_fn, which is not set",
            "remove timeout_s",
        )
    if reward.score_normalization == "ref":
        explicit = reward.score_ref_mean is not None and reward.score_ref_std is not None
        if not explicit and reward.use_reward_branch and sources > 1:
            problems.add(
                "reward.score_normalization",
                "ref",
                "without score_ref_mean/score_ref_std takes the reward "
                "branch's own statistics, which do not describe a weighted sum of several reward sources",
                "set score_ref_mean and score_ref_std for the sum, or use score_normalization: running",
            )
        if not explicit and not reward.use_reward_branch:
            problems.add(
                "reward.score_normalization",
                "ref",
                "needs reward.score_ref_mean and reward.score_ref_std (or a reward branch whose checkpoint holds them)",
                "set both, or use score_normalization: running",
            )
    else:
        for name in ("score_ref_mean", "score_ref_std"):
            if getattr(reward, name) is not None:
                problems.add(
                    f"reward.{name}",
                    getattr(reward, name),
                    f"is only used with reward.score_normalization: ref (it is {reward.score_normalization!r})",
                    f"set score_normalization: ref, or remove {name}",
                )
