"""A checkpoint measured on held-out prompts, the policy against its reference.

A held-out measurement samples one response per prompt from the trained policy (seeded, at the
run's temperature), scores it with the reward function named (or, for a run of a reasoning-gym
task, its verifiers on the task's held-out items), and runs the hydra once more to get the policy's
and the reference's log-probs of those responses: KL (nats per response) is the mean over responses
of sum_t (log pi - log pi_ref), the k1 estimate on fresh samples, as `objective/kl` is in training.
It also counts the answers that end with EOS inside the token limit, those with a looping tail
(algo/degeneration.py) and distinct-2 (distinct token bigrams over all bigrams of all responses,
Li et al. 2016).

    python -m hydrappo.study measure CHECKPOINT [CHECKPOINT ...] --prompts P --reward_fn R [--seeds 1234 1 2 3]
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import statistics
from pathlib import Path

import torch

from ..algo.degeneration import degeneration_flags
from ..algo.masked import masked_sum
from ..config import Config, RewardArgs, parse_config
from ..data import load_prompt_table, tokenize_prompts
from ..evaluation.compare import task_held_out
from ..generation.responses import generate_responses
from ..prompts import trl_arguments
from ..rewards import build_reward_source
from ..storage.checkpoint import (
    CheckpointError,
    find_checkpoint,
    load_checkpoint_config,
    load_trainable_weights,
    seed_everything,
)
from ..storage.models import build_hydra
from ..data import pack_sequences
from ..train.sequences import experience_pass


def distinct_n(token_rows: list[list[int]], n: int = 2) -> float:
    """Distinct n-grams over all n-grams of all responses (Li et al. 2016, distinct-n)."""
    grams = [tuple(row[i : i + n]) for row in token_rows for i in range(len(row) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def same_opening_share(texts: list[str], words: int = 4) -> tuple[float, str]:
    """The share of answers whose first `words` words (lower-cased) are the most common opening, and
    that opening: a policy that answers every prompt with one sentence shows here before distinct-n
    falls (the over-optimised "I'm thrilled to ..." of Gao et al.'s regime)."""
    if not texts:
        return 0.0, ""
    openings = collections.Counter(" ".join(text.split()[:words]).lower() for text in texts)
    opening, count = openings.most_common(1)[0]
    return count / len(texts), opening


@torch.no_grad()
def heldout(
    run_dir: Path | None,
    prompts: Path,
    reward_fn: str,
    *,
    base_config: Path | None = None,
    limit: int | None = None,
    seed: int = 1234,
    samples: int = 4,
    base_options: list[str] | None = None,
) -> dict:
    """Measure the latest checkpoint of `run_dir` (or, with run_dir None, the base model of
    `base_config` with the command-line options `base_options`, e.g. a reward branch's path that
    the config file names elsewhere) on held-out prompts; see the module docstring."""
    hydra, tokenizer, config = load_policy(run_dir, base_config, base_options)
    return measure_heldout(hydra, tokenizer, config, prompts, reward_fn, limit=limit, seed=seed, samples=samples)


def load_policy(run_dir: Path | None, base_config: Path | None = None, base_options: list[str] | None = None):
    """(hydra, tokenizer, config) of the latest checkpoint of `run_dir` (or a checkpoint folder),
    or with run_dir None of the base model of `base_config` with `base_options`."""
    if run_dir is not None:
        checkpoint = find_checkpoint(run_dir)
        config = load_checkpoint_config(checkpoint, Config)
    else:
        checkpoint, config = None, parse_config(base_config, list(base_options or []))
    seed_everything(config.train.seed)
    hydra, tokenizer = build_hydra(config.model, config.lora, value_head=config.ppo.uses_critic)
    if checkpoint is not None:
        load_trainable_weights(hydra, checkpoint)
    return hydra, tokenizer, config


@torch.no_grad()
def measure_heldout(
    hydra, tokenizer, config: Config, prompts: Path, reward_fn: str, *, limit=None, seed=1234, samples=4
) -> dict:
    """heldout() on a hydra already built: its policy against its reference, with the config's data
    and generation settings."""
    hydra.eval()
    data, generation = config.data, config.generation
    task = None
    if prompts is None:  # a run of a reasoning-gym task: its held-out items, scored by its verifiers
        task, columns = task_held_out(config, limit)
        data = copy.deepcopy(data)  # the task fits its prompt length into it; the caller's config stays as it was
        prompt_set = task.prompt_set("eval", tokenizer, data, limit)  # as the run formats them
        texts = [row["prompt"] for row in task.rows("eval")][: limit or None]  # plain text for a base model
    else:
        texts, columns = load_prompt_table(str(prompts), data.prompt_column)  # the other columns go to the reward
        texts, columns = texts[:limit], {name: values[:limit] for name, values in columns.items()}
        prompt_set = tokenize_prompts(
            texts, tokenizer, data.max_prompt_length, data.apply_chat_template, data.system_prompt
        )
    torch.manual_seed(seed)
    responses = generate_responses(hydra, tokenizer, prompt_set.input_ids, generation)
    input_ids, attention_mask, action_mask, prompt_width = pack_sequences(
        responses.prompt_ids, responses.response_ids, tokenizer.pad_token_id
    )
    out = experience_pass(
        hydra,
        input_ids,
        attention_mask,
        prompt_width,
        temperature=generation.temperature,
        chunk_size=generation.generation_batch_size,
        with_reference=True,
    )
    kl = masked_sum(out.logprobs.float() - out.ref_logprobs.float(), action_mask.to(out.logprobs.device), dim=-1).cpu()
    response_texts = tokenizer.batch_decode(responses.response_ids, skip_special_tokens=True)
    if task is not None:  # each verifier scores its own task's items (None elsewhere), as in training
        conversational = texts and not isinstance(texts[0], str)  # an answer start: the turn it opened
        completions = trl_arguments(texts, response_texts)[1] if conversational else response_texts
        by_task = [verify(completions, **columns) for verify in task.reward_funcs]
        scores = [next(s for s in item if s is not None) for item in zip(*by_task)]
    else:
        source = build_reward_source(RewardArgs(reward_fn=reward_fn))
        samples_text = [p + r for p, r in zip(texts, response_texts)]
        scores = [
            float(s)
            for s in source(
                samples_text, texts, response_texts, columns=columns, completion_ids=responses.response_ids
            ).total
        ]
    flags = degeneration_flags(responses.response_ids, responses.ended)
    eos = [s for s, ended in zip(responses.response_ids, responses.ended) if ended]
    opening_share, opening = same_opening_share(response_texts)
    return {
        "reward": statistics.fmean(scores),
        "solved": statistics.fmean(float(score >= 1.0) for score in scores),  # a verifier's full score
        "kl": kl.mean().item(),
        "eos_frac": statistics.fmean(map(float, responses.ended)),
        "degenerate_frac": statistics.fmean(map(float, flags)),
        "distinct2": distinct_n(
            [ids[:-1] if e and ids else ids for ids, e in zip(responses.response_ids, responses.ended)]
        ),
        "same_opening_share": opening_share,
        "same_opening": opening,
        "response_tokens_mean": statistics.fmean(len(ids) for ids in responses.response_ids),
        "prompts": len(texts),
        "ended_answers": len(eos),
        "samples": [
            {"prompt": p, "response": r, "score": s, "ended": e, "degenerate": d}
            for p, r, s, e, d in list(zip(texts, response_texts, scores, responses.ended, flags))[:samples]
        ],
    }


def measure_main(argv=None) -> int:
    """Measure checkpoints on held-out prompts at several sampling seeds (the same prompts, other
    draws of the answers), to see how far one measurement moves with the sampling alone:

        python -m hydrappo.study measure CHECKPOINT [CHECKPOINT ...] --prompts P --reward_fn R [--seeds 1234 1 2 3]

    Prints one line per checkpoint and seed (score, KL, distinct-2), then per checkpoint the mean
    over the seeds with the standard deviation of one measurement, and the standard deviation
    pooled over the checkpoints. With --output, appends each measurement as a JSON line and skips
    those the file already holds (a cut-off measurement resumes)."""
    parser = argparse.ArgumentParser(
        prog="python -m hydrappo.study measure",
        description="held-out measurements of checkpoints at several sampling seeds",
    )
    parser.add_argument("checkpoints", nargs="+", type=Path, help="checkpoint folders, or output_dirs (the newest)")
    parser.add_argument(
        "--prompts", type=Path, default=None, help="the held-out prompts file (none: the run's task's held-out items)"
    )
    parser.add_argument("--reward_fn", default=None, help="the held-out reward, 'file.py:function' (with --prompts)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1234, 1, 2, 3])
    parser.add_argument("--limit", type=int, default=None, help="held-out prompts to use (default: all)")
    parser.add_argument("--output", type=Path, default=None, help="JSON lines, one per measurement (appended)")
    args = parser.parse_args(argv)
    if len(set(args.seeds)) < 2:
        raise SystemExit("--seeds: give at least two different seeds; one measurement has no spread to show")
    if (args.prompts is None) != (args.reward_fn is None):
        raise SystemExit("measure: give --prompts and --reward_fn together, or neither (a task run's held-out items)")
    if args.prompts is not None and not args.prompts.is_file():
        raise SystemExit(f"--prompts {args.prompts}: no such file; give the held-out prompts file (.jsonl, .csv, ...)")
    done = []
    if args.output is not None and args.output.exists():
        done = [json.loads(line) for line in args.output.read_text().splitlines() if line.strip()]

    measured: dict[str, list[dict]] = {}
    for checkpoint in args.checkpoints:
        try:
            name = str(find_checkpoint(checkpoint))
        except CheckpointError as error:
            raise SystemExit(f"measure: {error}") from None
        rows = measured.setdefault(name, [r for r in done if r["checkpoint"] == name and r["seed"] in args.seeds])
        missing = [seed for seed in args.seeds if seed not in {r["seed"] for r in rows}]
        if missing:
            hydra, tokenizer, config = load_policy(Path(name))
            for seed in missing:
                m = measure_heldout(
                    hydra, tokenizer, config, args.prompts, args.reward_fn, limit=args.limit, seed=seed, samples=0
                )
                kept = ("reward", "solved", "kl", "distinct2", "prompts")
                row = {"checkpoint": name, "seed": seed, **{k: m[k] for k in kept}}
                rows.append(row)
                if args.output is not None:
                    with args.output.open("a") as file:
                        file.write(json.dumps(row) + "\n")
        for row in sorted(rows, key=lambda r: args.seeds.index(r["seed"])):
            print(
                f"{name}  seed {row['seed']}: score {row['reward']:.3f}, KL {row['kl']:.2f}, distinct-2 {row['distinct2']:.2f}"
            )
    spreads = []
    for name, rows in measured.items():
        scores = [r["reward"] for r in rows]
        spreads.append(statistics.stdev(scores))
        print(
            f"{name}: mean of {len(scores)} measurements {statistics.fmean(scores):.3f} "
            f"(sd of one {spreads[-1]:.3f}), KL {statistics.fmean(r['kl'] for r in rows):.2f}, "
            f"distinct-2 {statistics.fmean(r['distinct2'] for r in rows):.2f}"
        )
    pooled = (sum(sd * sd for sd in spreads) / len(spreads)) ** 0.5
    print(f"sd of one measurement, pooled over {len(spreads)} checkpoint(s): {pooled:.3f}")
    return 0
