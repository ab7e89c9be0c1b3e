"""Gold evaluation of the DPO route: the trained policy against its start on the 50 held-out prompts.

    python examples/preference/dpo_eval.py outputs/preference/dpo      # a `hydrappo dpo` run folder
    python examples/preference/dpo_eval.py DIR/model                   # or a plain transformers folder

The run's own hydra is rebuilt from its latest checkpoint (the trained layers as the policy, their
frozen copy as the reference). A plain transformers folder (another trainer's model, e.g. TRL's in
tools/lab/race_dpo.py) is the policy of a whole-model hydra whose reference is a frozen copy of
dpo.yaml's base model, so its KL is to the same start. Either is then measured as the reward-then-PPO route is (hydrappo.study,
with ppo.yaml's sampling settings: temperature 0.7, 32 tokens, seed 1234): gold VADER of one
answer per prompt, KL to the start in nats per answer, distinct-2, and the share of answers that
open with the most common four words. The base model is measured the same way (KL 0).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def measure(run_dir: Path | None, prompts: Path, reward_fn: str) -> dict:
    """hydrappo.study's held-out measures of a DPO run's latest checkpoint, of a plain transformers folder
    (see the module's docstring), or (None) of the base model."""
    from hydrappo.config import DPOConfig, parse_config
    from hydrappo.storage.checkpoint import find_checkpoint, is_checkpoint_folder, latest_checkpoint
    from hydrappo.storage.checkpoint import load_checkpoint_config, load_trainable_weights
    from hydrappo.storage.checkpoint import seed_everything
    from hydrappo.storage.models import build_hydra
    from hydrappo.study.measure import measure_heldout

    ppo = parse_config(HERE / "ppo.yaml", [], check=False)  # its sampling and prompt settings only
    plain_folder = None
    if run_dir is not None and not is_checkpoint_folder(run_dir) and latest_checkpoint(run_dir) is None:
        if not (run_dir / "config.json").is_file():
            raise SystemExit(f"{run_dir} is neither a hydrappo run (no checkpoints) nor a transformers folder.")
        plain_folder, run_dir = run_dir, None
    if run_dir is None:
        config = parse_config(HERE / "dpo.yaml", [], DPOConfig, check=False)
        checkpoint = None
        if plain_folder is not None:
            config.model.num_layers_unfrozen = -1  # the reference: a frozen copy of the whole base model
    else:
        checkpoint = find_checkpoint(run_dir)
        config = load_checkpoint_config(checkpoint, DPOConfig)
    seed_everything(config.train.seed)
    hydra, tokenizer = build_hydra(config.model, config.lora, value_head=False)
    if checkpoint is not None:
        load_trainable_weights(hydra, checkpoint)
    if plain_folder is not None:
        from transformers import AutoModelForCausalLM

        trained = AutoModelForCausalLM.from_pretrained(str(plain_folder), dtype=next(hydra.model.parameters()).dtype)
        hydra.model.load_state_dict(trained.state_dict())  # the policy only; the reference copy stays the base
    result = measure_heldout(hydra, tokenizer, ppo, prompts, reward_fn, samples=1000)
    result["texts"] = [sample["response"] for sample in result.pop("samples")]
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "runs", nargs="*", help="hydrappo dpo output folders or transformers folders (none: the base model only)"
    )
    parser.add_argument("--prompts", default=str(HERE.parent / "sentiment" / "eval_prompts.jsonl"))
    parser.add_argument("--reward_fn", default=f"{HERE.parent / 'sentiment' / 'reward.py'}:reward_fn")
    parser.add_argument("--no_base", action="store_true", help="skip measuring the base model")
    parser.add_argument("--output", default="outputs/preference/dpo_eval.json")
    args = parser.parse_args(argv)
    results = {} if args.no_base else {"base": measure(None, Path(args.prompts), args.reward_fn)}
    for run in args.runs:
        results[run] = measure(Path(run), Path(args.prompts), args.reward_fn)
    print("| model | gold VADER | KL (nats) | distinct-2 | same first 4 words | ends with EOS |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, r in results.items():
        print(
            f"| {name} | {r['reward']:.3f} | {r['kl']:.2f} | {r['distinct2']:.3f} | "
            f"{r['same_opening_share']:.2f} ({r['same_opening']!r}) | {r['eos_frac']:.2f} |"
        )
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
