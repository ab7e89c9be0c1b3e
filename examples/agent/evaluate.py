"""Held-out episodes of a model, without training: the eval/* numbers a run logs at step 0, for
the base model and the SFT model (README).

    python examples/agent/evaluate.py smollm2-135m-instruct     # the base model
    python examples/agent/evaluate.py outputs/agent/sft         # after the SFT stage
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from hydrappo import PPOTrainer
from hydrappo.config import parse_config

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    model = argv[0] if argv else "smollm2-135m-instruct"
    with tempfile.TemporaryDirectory() as out:
        config = parse_config(HERE / "config.yaml", ["--name_or_path", model, "--output_dir", out])
        trainer = PPOTrainer(config, config_dir=HERE)
        stats, samples = trainer.evaluate_held_out(0)
    print(json.dumps({k: round(v, 4) for k, v in stats.items() if k.startswith("eval/")}, indent=1))
    for sample in samples[:3]:
        print("---", sample["score"], repr(sample["response"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
