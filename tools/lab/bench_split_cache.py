"""The supervised stages' trunk cache (train/stage.py SplitCache) with and without reading an
example's states from a longer example its tokens begin (a conversation's rows, one per assistant
turn), side by side in one process.

An SFT config is built as `hydrappo sft` builds it; its examples (training and held out) are counted
in tokens through the frozen bottom both ways, and the first --timed examples are cached both ways,
alternating, in fresh caches (medians of --repeats).

    python tools/lab/bench_split_cache.py examples/planning/sft.yaml --threads 2 --timed 96 --repeats 2

On a shared machine compare the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench_shared_prompts import run_arguments, trainer_of  # noqa: E402 (imports no torch)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    run_arguments(parser, "sft")
    parser.add_argument("--timed", type=int, default=96, help="examples cached in each timed fill (the first ones)")
    parser.add_argument("--repeats", type=int, default=2)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch

    import hydrappo.train.stage as stage
    from hydrappo.config import SFTConfig
    from hydrappo.train.sft import SFTTrainer

    with trainer_of(args, SFTTrainer, SFTConfig) as trainer:
        examples = trainer.cache_examples()
        tokens = {key: (*prompt, *response) for key, (prompt, response) in examples.items()}
        covering = stage.covering_examples(tokens)
        computed = sum(len(tokens[key]) for key in tokens if covering[key] == key)
        total = sum(map(len, tokens.values()))
        print(
            f"{len(tokens)} examples, {total} tokens through the frozen bottom when every example is computed; "
            f"{sum(covering[k] == k for k in tokens)} examples, {computed} tokens ({computed / total:.2f}x) when an "
            "example that begins another reads its states from it"
        )

        timed = dict(sorted(examples.items())[: args.timed])
        covering_function = stage.covering_examples
        settings = {"covered": covering_function, "every example": lambda tokens: {key: key for key in tokens}}
        seconds: dict[str, list[float]] = {name: [] for name in settings}
        pad, chunk = trainer.tokenizer.pad_token_id, trainer.config.train.batch_size
        for round_index in range(args.repeats):
            names = list(settings) if round_index % 2 == 0 else list(reversed(settings))
            for name in names:
                stage.covering_examples = settings[name]
                try:
                    cache = stage.SplitCache(trainer.hydra, enabled=True)
                    start = time.perf_counter()
                    cache.fill(timed, pad, chunk)
                    seconds[name].append(time.perf_counter() - start)
                finally:
                    stage.covering_examples = covering_function
                print(f"round {round_index}: {name}: {seconds[name][-1]:.1f} s", flush=True)
    covered, every = (statistics.median(seconds[name]) for name in settings)
    print(f"\nthe first {len(timed)} examples, threads {torch.get_num_threads()}, medians of {args.repeats}:")
    print(f"covered {covered:.1f} s, every example {every:.1f} s: {covered / every:.2f}x")


if __name__ == "__main__":
    main()
