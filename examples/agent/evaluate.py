"""Held-out episodes of a model, without training: the eval/* numbers a run logs at step 0, for
the base model and the SFT model (README; the planning example's too, with its config).

    python examples/agent/evaluate.py smollm2-135m-instruct     # the base model
    python examples/agent/evaluate.py outputs/agent/sft         # after the SFT stage
    python examples/agent/evaluate.py outputs/planning/sft --config examples/planning/config.yaml
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default="smollm2-135m-instruct", help="model.name_or_path")
    parser.add_argument("--config", type=Path, default=HERE / "config.yaml", help="the example's RL config")
    parser.add_argument("--samples", type=int, default=3, help="held-out episodes to print")
    args = parser.parse_args(argv)

    from hydrappo import PPOTrainer
    from hydrappo.config import parse_config

    with tempfile.TemporaryDirectory() as out:
        config = parse_config(args.config, ["--name_or_path", args.model, "--output_dir", out])
        trainer = PPOTrainer(config, config_dir=args.config.resolve().parent)
        stats, samples = trainer.evaluate_held_out(0)
    print(json.dumps({k: round(v, 4) for k, v in stats.items() if k.startswith("eval/")}, indent=1))
    for sample in samples[: args.samples]:
        print("---", sample["score"], repr(sample["response"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
