"""Levers against the GRPO recipe's degenerate answers: one row per lever, on held-out questions.

    python examples/arithmetic/levers.py --steps 16                       # every lever below
    python examples/arithmetic/levers.py --steps 50 --variants base k3    # a few, longer

Each variant is `hydrappo train examples/arithmetic/config.yaml` with the options of VARIANTS
(printed as it starts; a finished run in its folder is reused, a cut-off one resumed). Its
checkpoint is then measured on the 100 held-out questions (hydrappo.study): accuracy, KL to
the reference (nats per answer), the share of answers that end with EOS inside the 32-token
limit, the share with a looping tail, and a few answers to read. The table and the JSON go to
`--output_dir` (levers.md, levers.json).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hydrappo.study.measure import heldout
from hydrappo.study.sweeps import Variant, markdown_table, read_metrics, run_variant, summarise_metrics

HERE = Path(__file__).resolve().parent

ACCURACY = ["--reward_fn", "reward.py:accuracy", "--reward_weights", "1.0"]  # the earlier recipe: no format term
K3 = ["--init_kl_coef", "0.02", "--kl_penalty", "loss", "--kl_estimator", "k3"]  # GRPO's KL in the loss
DAPO = ["--overlong_buffer", "8", "--mask_truncated"]  # soft overlong penalty + overlong filtering
DR_GRPO = ["--advantage_estimator", "dr_grpo", "--loss_agg_mode", "seq-mean-token-sum"]

VARIANTS = {  # config.yaml weighs a format term 0.2 beside accuracy: "format" is config.yaml as it is
    "base": ACCURACY,
    "k3": ACCURACY + K3,
    "dapo": ACCURACY + DAPO,
    "format": [],
    "dr_grpo": ACCURACY + DR_GRPO,
    "k3+dapo+format": K3 + DAPO,
}

COLUMNS = [
    ("lever", "name", ""),
    ("steps", "steps", "d"),
    ("held-out accuracy", "reward", ".2f"),
    ("KL (nats)", "kl", ".2f"),
    ("ends with EOS", "eos_frac", ".2f"),
    ("degenerate", "degenerate_frac", ".2f"),
    ("distinct-2", "distinct2", ".2f"),
    ("tokens", "response_tokens_mean", ".1f"),
    ("train reward, last 5", "train_reward_last", ".2f"),
    ("entropy, last 5", "entropy_last", ".2f"),
    ("median step s", "median_step_s", ".1f"),
]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--steps", type=int, default=50, help="PPO steps per variant (config.yaml: 50)")
    parser.add_argument("--config", default=str(HERE / "config.yaml"))
    parser.add_argument("--eval_prompts", default=str(HERE / "eval_prompts.jsonl"))
    parser.add_argument("--limit", type=int, default=None, help="held-out questions to use (default: all 100)")
    parser.add_argument("--output_dir", default="outputs/arithmetic/levers")
    parser.add_argument("--base", action="store_true", help="also measure the untrained model")
    args = parser.parse_args(argv)
    out = Path(args.output_dir)
    reward_fn = f"{HERE / 'reward.py'}:accuracy"  # whatever the variant was rewarded with
    rows = []
    if args.base:
        rows.append(
            {
                "name": "untrained",
                "steps": 0,
                **heldout(None, Path(args.eval_prompts), reward_fn, base_config=Path(args.config), limit=args.limit),
            }
        )
    for name in args.variants:
        variant = Variant(name, Path(args.config), VARIANTS[name])
        run_dir = out / name.replace("+", "_")
        run = run_variant(variant, run_dir, args.steps)
        row = {"name": name, **run, **summarise_metrics(read_metrics(run_dir), last=5)}
        row.update(heldout(run_dir, Path(args.eval_prompts), reward_fn, limit=args.limit))
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "samples"}), flush=True)
        (out / "levers.json").write_text(json.dumps(rows, indent=1))
    table = markdown_table(rows, COLUMNS)
    answers = "\n".join(
        f"- {row['name']}: " + " / ".join(f"`{s['response']!r}`" for s in row["samples"][:3]) for row in rows
    )
    (out / "levers.md").write_text(table + "\n\nFirst held-out answers:\n" + answers + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
