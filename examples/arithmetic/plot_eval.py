"""The held-out curve of an arithmetic run, from its metrics.jsonl: accuracy on the 100 held-out
questions (eval/reward/accuracy), the share of answers in the format term's shape, the share
that end with EOS inside the token limit and the share with a looping tail, against the step;
the training batches' accuracy beside them.

    python examples/arithmetic/plot_eval.py outputs/arithmetic                  # -> outputs/arithmetic/eval_curve.png
    python examples/arithmetic/plot_eval.py outputs/arithmetic --out examples/arithmetic/eval_curve.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

CURVES = [  # (metrics key, label, transform)
    ("eval/reward/accuracy", "held-out accuracy", lambda v: v),
    ("eval/reward/format_reward", "held-out: one line ending in the number", lambda v: v),
    ("eval/missing_eos_frac", "held-out: ends with EOS", lambda v: 1.0 - v),
    ("eval/degenerate_frac", "held-out: looping tail", lambda v: v),
]
# The format and EOS shares often coincide (an answer in the format's shape ends), so each curve has
# its own line style and marker: a line drawn over another stays visible.
STYLES = {
    "held-out accuracy": dict(marker="o", linestyle="-", linewidth=2),
    "held-out: one line ending in the number": dict(marker="s", linestyle="--", markersize=9, fillstyle="none"),
    "held-out: ends with EOS": dict(marker="x", linestyle=":", markersize=7, linewidth=2),
    "held-out: looping tail": dict(marker="v", linestyle="-."),
}


def curves(metrics: Path) -> tuple[dict[str, list[tuple[int, float]]], list[tuple[int, float]]]:
    """({label: [(step, value)]} of the evaluations, [(step, training accuracy)])."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    held_out = {label: [(r["step"], f(r[key])) for r in rows if key in r] for key, label, f in CURVES}
    train = [(r["step"], r["env/reward/accuracy"]) for r in rows if "env/reward/accuracy" in r]
    return held_out, train


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="the run's output_dir (holds metrics.jsonl)")
    parser.add_argument("--out", type=Path, help="the PNG (default: RUN/eval_curve.png)")
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    held_out, train = curves(args.run / "metrics.jsonl")
    figure, axes = plt.subplots(figsize=(7, 4))
    for label, points in held_out.items():
        if points:
            axes.plot(*zip(*points), label=label, **STYLES[label])
    if train:
        axes.plot(*zip(*train), color="grey", alpha=0.4, linewidth=1, label="training batches' accuracy")
    axes.set(
        xlabel="step", ylabel="share of answers", ylim=(-0.02, 1.02), title="arithmetic (GRPO), held-out questions"
    )
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    out = args.out or args.run / "eval_curve.png"
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    for label, points in held_out.items():
        print(f"{label}: " + ", ".join(f"step {s} {v:.2f}" for s, v in points))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
