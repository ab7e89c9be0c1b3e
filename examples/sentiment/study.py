"""Top-N against LoRA against full fine-tuning on the sentiment example (PPO, held-out VADER reward at the config's KL target, so at matched KL).

    python examples/sentiment/study.py                       # N = 1, 2, 4, 8, LoRA r=16 on all layers, full
    python examples/sentiment/study.py --steps 20 --variants N=1 N=4

One `hydrappo train examples/sentiment/config.yaml` per setting (options in hydrappo/study/sweeps.py
STUDY_VARIANTS; the commands are printed), measured on the held-out prompts; each row also
has the median step time and the peak resident memory of the run on this machine, and the
memory planner's peak for the same setting on a 7-8B model (and whether it fits 24 GB).
Writes study.md, study.json and study.png to --output_dir. Step times are comparable only
between rows measured on the same, otherwise idle, machine.
"""

import sys
from pathlib import Path

from hydrappo.study.sweeps import study_main

HERE = Path(__file__).resolve().parent

DEFAULTS = {
    "config": HERE / "config.yaml",
    "eval_prompts": HERE / "eval_prompts.jsonl",
    "reward_fn": f"{HERE / 'reward.py'}:reward_fn",
    "output_dir": "outputs/sentiment/study",
}

if __name__ == "__main__":
    sys.exit(study_main(DEFAULTS, __doc__))
