"""What TRL's reward contract hands a reward function besides the data (trainer_state,
log_metric, log_extra), and the sample rows the logged extra columns join."""

from __future__ import annotations

TRL_EXTRAS = ("trainer_state", "log_metric", "log_extra")  # what TRL's GRPOTrainer passes besides the columns


class RewardContext:
    """What TRL's GRPOTrainer hands its reward functions besides the data, kept by the trainer for
    the call in progress: `trainer_state` (a transformers TrainerState: global_step = the steps done,
    max_steps), `log_metric(name, value)` (scalars, averaged over a step's calls and logged as
    reward_metrics/<name>, eval/reward_metrics/<name> while evaluating) and `log_extra(column,
    values)` (one value per sample, shown as a column of the samples table in TensorBoard)."""

    def __init__(self, max_steps: int = 0):
        from transformers import TrainerState

        self.trainer_state = TrainerState(global_step=0, max_steps=max_steps)
        self.metrics: dict[str, list[float]] = {}
        self.extras: dict[str, list] = {}

    def log_metric(self, name: str, value: float) -> None:
        self.metrics.setdefault(str(name), []).append(float(value))

    def log_extra(self, column: str, values: list) -> None:
        self.extras.setdefault(str(column), []).extend(values)

    def arguments(self) -> dict:
        return {"trainer_state": self.trainer_state, "log_metric": self.log_metric, "log_extra": self.log_extra}

    def take(self, prefix: str = "") -> tuple[dict, dict]:
        """({prefix}reward_metrics/<name>: mean of the values logged since the last take, extra columns); both emptied."""
        metrics = {f"{prefix}reward_metrics/{name}": sum(v) / len(v) for name, v in self.metrics.items() if v}
        extras, self.metrics, self.extras = self.extras, {}, {}
        return metrics, extras


def with_columns(rows: list[dict], extras: dict) -> list[dict]:
    """Sample rows ({prompt, response, score}) with the columns reward functions logged for them
    (log_extra: one value per sample, in order; a column of another length is left out)."""
    kept = {column: values for column, values in extras.items() if len(values) == len(rows)}
    return [{**row, **{column: values[i] for column, values in kept.items()}} for i, row in enumerate(rows)]
