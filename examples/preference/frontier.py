"""Reward-versus-KL frontier of the preference example (PPO on the learned reward branch): held-out GOLD reward for several KL targets.

    python examples/preference/frontier.py                          # the values below, the config's steps
    python examples/preference/frontier.py --values 2 6 --steps 20  # fewer, shorter

One `hydrappo train examples/preference/ppo.yaml --kl_target V` per value (the commands are printed; a
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
    "config": HERE / "ppo.yaml",
    "eval_prompts": HERE.parent / "sentiment" / "eval_prompts.jsonl",
    "reward_fn": f"{HERE.parent / 'sentiment' / 'reward.py'}:reward_fn",
    "knob": "kl_target",
    "values": [1.0, 2.0, 4.0, 8.0],
    "options": [],
    "output_dir": "outputs/preference/frontier",
}

if __name__ == "__main__":
    sys.exit(frontier_main(DEFAULTS, __doc__))
