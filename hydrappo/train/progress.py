"""The progress bar of a run (tqdm): steps, the latest value of each stat the loop names, and
what the run is doing between steps (a held-out evaluation), so that nothing slow is silent.

A stat logged only at some steps (eval/* at the evaluation steps) stays on the bar until it is
renewed. The bar's clock starts at the first step, so its time per step is the steps' alone:
the step-0 evaluation before it has its own time (time/eval in metrics.jsonl)."""

from __future__ import annotations

import logging
import time

logger = logging.getLogger("hydrappo")


class ProgressBar:
    def __init__(self, name: str, progress: dict, total: int, initial: int, enabled: bool):
        """`progress`: {label on the bar: stats key}, shown in that order."""
        from tqdm.auto import tqdm

        self.name, self.progress = name, progress
        self.shown: dict[str, str] = {}
        self.tqdm = tqdm(total=total, initial=initial, desc=name, disable=not enabled, dynamic_ncols=True)

    def show(self, step: int, record: dict) -> None:
        """One logged record: a step done (step > 0), and its values on the bar."""
        self.shown.update({label: f"{record[key]:.3f}" for label, key in self.progress.items() if key in record})
        if step:
            self.tqdm.update(1)
        if self.shown:  # (a dict keeps the order; tqdm sorts keyword arguments)
            self.tqdm.set_postfix({label: self.shown[label] for label in self.progress if label in self.shown})

    def restart_clock(self) -> None:
        """Start the clock now: what ran before the first step is not a step's time."""
        if not self.tqdm.disable:
            self.tqdm.start_t = self.tqdm.last_print_t = time.time()  # (tqdm's own clock)

    def status(self, text: str | None) -> None:
        """Say what the run does now (also in the log, for runs without a bar); None: the plain label."""
        if text:
            logger.info("%s", text)
        self.tqdm.set_description_str(f"{self.name} ({text})" if text else self.name)

    def close(self) -> None:
        self.tqdm.close()


def samples_markdown(samples: list[dict]) -> str:
    """Rows of {prompt, response, score, and any column a reward function added (TRL's log_extra)} as a
    markdown table (TensorBoard's text tab)."""

    def cell(value) -> str:
        text = f"{value:.3f}" if isinstance(value, float) else str(value)
        return text.replace("|", "\\|").replace("\n", " ")

    columns = ["prompt", "response", "score"] + [
        key for key in samples[0] if key not in ("prompt", "response", "score")
    ]
    rows = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    rows += ["| " + " | ".join(cell(sample.get(key, "")) for key in columns) + " |" for sample in samples]
    return "\n".join(rows)
