"""Which settings make the reward branch rank: one row per lever, measured on held-out pairs.

    python examples/preference/levers.py --pairs outputs/preference/pairs.jsonl \
        --variants base mean mean_lr3e-4 ...            # rows of the table in README.md

Each variant is `hydrappo reward examples/preference/reward.yaml` with a few options changed
(VARIANTS below), trained in this process on one shared trunk. Variants that read the same
pairs with the same split share the frozen trunk's cached outputs (train.cache_split_hidden),
so the trunk's pass over a data set is paid once and reported on its own line; each row's
CPU time is that of training the branch, evaluating it and its reference statistics.

A row reports the held-out accuracy on every pair (ties are not in the data), on the pairs
whose gold scores differ by at least 0.3 (`--gap`), and the accuracy on the training pairs.
The held-out pairs are those of 10% of the distinct prompts (reward.yaml's eval_fraction),
never trained on. Which prompts those are depends on the set of distinct prompts, so two
data sets with different prompts are scored on different held-out pairs. `--num_pairs` keeps
the first K rows of the pairs files. `--other_pairs FILE` adds a column: the accuracy on pairs
built the same way from prompts of another style (make_pairs.py --prompts
examples/preference/other_prompts.jsonl), none of them trained on.

New prompts rather than more samples of the same ones: `make_pairs.py --prompts
examples/preference/new_prompts.jsonl --output NEW.jsonl` (300 prompts on other topics, none in
the sentiment or other-style files), then `--pairs outputs/preference/pairs.jsonl NEW.jsonl`.
`wide_prompts.jsonl` holds 1,000 more: 100 subjects, none of them an other-style prompt's, in
10 phrasings each (some of them the other style's, e.g. "Describe your experience with").

Variants that change which layers the branch copies (top2, top4, top8, from13) start at another
split: each such group loads the model again and fills its own cache.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from hydrappo.config import RewardConfig, parse_config
from hydrappo.data import split_by_prompt
from hydrappo.preferences import load_preference_pairs
from hydrappo.train.reward_model import RewardTrainer

HERE = Path(__file__).resolve().parent

# name -> options of `hydrappo reward` on top of reward.yaml
VARIANTS = {
    "base": [],
    "lr1e-4": ["--learning_rate", "1e-4"],
    "mean": ["--pooling", "mean"],
    "mean_lr3e-4": ["--pooling", "mean", "--learning_rate", "3e-4"],
    "mean_lr1e-5": ["--pooling", "mean", "--learning_rate", "1e-5"],
    "mean_4ep": ["--pooling", "mean", "--epochs", "4"],
    "mean_1ep": ["--pooling", "mean", "--epochs", "1"],
    "mean_margin": ["--pooling", "mean", "--margin_column", "gold_margin"],
    "last_lr3e-4": ["--learning_rate", "3e-4"],
    "mean_lr3e-4_4ep": ["--pooling", "mean", "--learning_rate", "3e-4", "--epochs", "4"],
    # Which layers the branch trains (reward.yaml's pooling and learning rate). The branch is a
    # copy of every layer from the split up, so a band starting at layer S trains as many layers
    # as the top 30 - S: depth is the one choice.
    "top2": ["--num_layers_unfrozen", "2"],
    "top4": ["--num_layers_unfrozen", "4"],
    "top8": ["--num_layers_unfrozen", "8"],
    "from13": ["--trainable_layers", "13:17"],
    # GRM's regulariser (arXiv 2406.10216): the LM loss on the chosen answers, weighted.
    "grm0.01": ["--lm_loss_weight", "0.01"],
    "grm0.1": ["--lm_loss_weight", "0.1"],
    "grm0.1_lr1e-4": ["--lm_loss_weight", "0.1", "--learning_rate", "1e-4"],
    # More epochs, keeping the epoch whose held-out accuracy was best. That selects on the held-out
    # pairs themselves, so the other-style column is this row's unbiased one.
    "6ep_best": ["--epochs", "6", "--load_best_model_at_end"],
    "6ep_best_lr1e-4": ["--epochs", "6", "--load_best_model_at_end", "--learning_rate", "1e-4"],
    # Four heads on the one branch, each on its own bootstrap resample (Coste et al. 2023); ranked by their mean.
    "heads4": ["--reward_heads", "4"],
}


def write_pairs(sources: list[str], num_pairs: int, path: Path) -> list[dict]:
    """The first `num_pairs` rows of the pairs files, in order, with a `gold_margin` column
    (gold chosen minus gold rejected) for the margin lever."""
    rows = []
    for source in sources:
        with open(source) as handle:
            rows.extend(json.loads(line) for line in handle if line.strip())
    rows = rows[:num_pairs] if num_pairs else rows
    with open(path, "w") as handle:
        for row in rows:
            handle.write(json.dumps({**row, "gold_margin": row["gold_chosen"] - row["gold_rejected"]}) + "\n")
    return rows


def accuracy(chosen: torch.Tensor, rejected: torch.Tensor) -> float:
    """The share of pairs ranked right; a branch of several heads ranks by their mean score."""
    if chosen.dim() == 2:
        chosen, rejected = chosen.mean(dim=1), rejected.mean(dim=1)
    return float((chosen > rejected).float().mean()) if chosen.numel() else float("nan")


def held_out_index(trainer: RewardTrainer, rows: list[dict]) -> list[int]:
    """The indices of the rows that the trainer held out, in its order."""
    data, train = trainer.config.data, trainer.config.train
    return split_by_prompt([row["prompt"] for row in rows], data.eval_fraction, train.seed)[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--pairs",
        nargs="+",
        default=["outputs/preference/pairs.jsonl"],
        help="pairs files (make_pairs.py), read in order",
    )
    parser.add_argument("--num_pairs", type=int, default=0, help="keep the first K pairs (0: all)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--config", default=str(HERE / "reward.yaml"))
    parser.add_argument("--output_dir", default="outputs/preference/levers")
    parser.add_argument("--other_pairs", help="pairs from prompts of another style, scored by every variant")
    parser.add_argument("--gap", type=float, default=0.3, help="the gold-gap threshold of the second accuracy")
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="options for every variant (last)")
    args = parser.parse_args(argv)

    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    data_file = out / f"pairs_{args.num_pairs or 'all'}.jsonl"
    rows = write_pairs(args.pairs, args.num_pairs, data_file)
    hydra = tokenizer = None
    shared_rows: dict = {}
    split_of_shared = other = None
    results = []
    for name in args.variants:
        overrides = [
            "--train_file",
            str(data_file),
            "--output_dir",
            str(out / name),
            "--overwrite_output_dir",
            "--no_progress_bar",
            *VARIANTS[name],
            *args.extra,
        ]
        config = parse_config(args.config, overrides, config_cls=RewardConfig)
        split = (config.model.num_layers_unfrozen, config.model.trainable_layers)
        if split != split_of_shared:  # another split: another model and another cache
            hydra, shared_rows, split_of_shared = None, {}, split
        start = time.process_time()
        trainer = RewardTrainer(config, hydra=hydra, tokenizer=tokenizer)
        hydra, tokenizer = trainer.hydra, trainer.tokenizer
        # Same pairs, same split: the frozen trunk's outputs are the same for every variant.
        trainer.split_cache.rows = shared_rows
        if not shared_rows:
            trainer.split_cache.fill(trainer.cache_examples(), tokenizer.pad_token_id, config.train.eval_batch_size)
            trunk_cpu = time.process_time() - start
            print(f"trunk pass over {len(rows)} pairs: {trunk_cpu / 60:.1f} CPU-min", flush=True)
            start = time.process_time()
        trainer.train()
        held = [rows[i] for i in held_out_index(trainer, rows)]
        pairs = trainer.eval_pairs
        chosen = trainer.score(pairs.prompt_ids, pairs.chosen_ids)
        rejected = trainer.score(pairs.prompt_ids, pairs.rejected_ids)
        gaps = torch.tensor([row["gold_chosen"] - row["gold_rejected"] for row in held])
        wide = gaps >= args.gap
        train_stats = trainer.evaluate(trainer.train_pairs, "train")
        other_acc = float("nan")
        if args.other_pairs:
            if other is None:  # read once: only the texts are scored, with the one tokenizer; no margin is needed
                scored = dataclasses.replace(config.data, margin_column=None)
                other = load_preference_pairs(args.other_pairs, tokenizer, scored, setting="--other_pairs")
            other_acc = accuracy(
                trainer.score(other.prompt_ids, other.chosen_ids), trainer.score(other.prompt_ids, other.rejected_ids)
            )
        result = {
            "variant": name,
            "options": " ".join(VARIANTS[name] + args.extra),
            "pairs": len(rows),
            "branch_layers": len(trainer.branch.layers),
            "train_pairs": len(trainer.train_pairs),
            "held_out_pairs": len(pairs),
            "wide_pairs": int(wide.sum()),
            "held_out_acc": accuracy(chosen, rejected),
            "held_out_acc_wide": accuracy(chosen[wide], rejected[wide]),
            "train_acc": train_stats["train/accuracy"],
            "other_acc": other_acc,
            "cpu_min": (time.process_time() - start) / 60,
        }
        results.append(result)
        print(json.dumps(result), flush=True)
        with open(out / "levers.jsonl", "a") as handle:
            handle.write(json.dumps(result) + "\n")
        del trainer
    print(
        f"| variant | options | pairs | held-out acc (all) | held-out acc (gap >= {args.gap:.1f}) | train acc "
        "| other-style acc | CPU-min |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(
            f"| {r['variant']} | `{r['options']}` | {r['pairs']} | {r['held_out_acc']:.3f} ({r['held_out_pairs']}) | "
            f"{r['held_out_acc_wide']:.3f} ({r['wide_pairs']}) | {r['train_acc']:.3f} | {r['other_acc']:.3f} | "
            f"{r['cpu_min']:.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
