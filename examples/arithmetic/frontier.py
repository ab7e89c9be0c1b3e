"""Reward-versus-KL frontier of the arithmetic example (GRPO): held-out accuracy for several fixed k3 KL coefficients in the loss.

    python examples/arithmetic/frontier.py                          # the values below, the config's steps
    python examples/arithmetic/frontier.py --values 2 6 --steps 20  # fewer, shorter

One `hydrappo train examples/arithmetic/config.yaml --init_kl_coef V` per value (the commands are printed; a
finished run is reused, a cut-off one resumed), each measured on held-out prompts with
hydrappo.study (reward, KL in nats per response, EOS and degenerate shares, distinct-2),
and the untrained model as the origin. Writes frontier.png, frontier.md and frontier.json to
--output_dir. A point further up at the same KL is a better trade; one end number hides that.
"""

import sys
from pathlib import Path

from hydrappo.study.sweeps import frontier_main

HERE = Path(__file__).resolve().parent

DEFAULTS = {
    "config": HERE / "config.yaml",
    "eval_prompts": HERE / "eval_prompts.jsonl",
    "reward_fn": f"{HERE / 'reward.py'}:accuracy",
    "knob": "init_kl_coef",
    "values": [0.005, 0.02, 0.05, 0.2],
    "options": ["--kl_penalty", "loss", "--kl_estimator", "k3"],
    "output_dir": "outputs/arithmetic/frontier",
}

if __name__ == "__main__":
    sys.exit(frontier_main(DEFAULTS, __doc__))
