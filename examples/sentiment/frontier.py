"""Reward-versus-KL frontier of the sentiment example (VADER reward, PPO with the PI KL controller): held-out reward for several KL targets.

    python examples/sentiment/frontier.py                          # the values below, the config's steps
    python examples/sentiment/frontier.py --values 2 6 --steps 20  # fewer, shorter

One `hydrappo train examples/sentiment/config.yaml --kl_target V` per value (the commands are printed; a
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
    "reward_fn": f"{HERE / 'reward.py'}:reward_fn",
    "knob": "kl_target",
    "values": [2.0, 4.0, 6.0, 10.0],
    "options": [],
    "output_dir": "outputs/sentiment/frontier",
}

if __name__ == "__main__":
    sys.exit(frontier_main(DEFAULTS, __doc__))
