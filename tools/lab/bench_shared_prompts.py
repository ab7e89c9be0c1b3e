"""PPO steps with and without shared prompts (ppo.share_prompts: rows that share a prompt pass it
once through the trainable layers, model/shared_prompt.py), side by side in one process.

One PPOTrainer is built from a run's config and options (as `hydrappo train` builds it); its steps
alternate between ppo.share_prompts true and false (the order reversed every round), after one
warm-up step of each. Both settings train the same model on, so they see the same weights and
the same kind of answers; only what a step passes through the trainable layers differs. Per
setting, the medians of the experience pass (the branches over the sampled batch), the update
(ppo_epochs x minibatches of forward and backward), the whole step, and the tokens that entered
the first trainable layer in one step.

    python tools/lab/bench_shared_prompts.py examples/reasoning/config.yaml --threads 2 --repeats 3 \\
        --options "--name_or_path outputs/reasoning/sft"

On a shared machine compare the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

PHASES = ("experience", "update", "step")


def run_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """The run a benchmark builds: a config file of `hydrappo COMMAND`, its options; torch's threads."""
    parser.add_argument("config", help=f"a `hydrappo {command}` config file")
    parser.add_argument("--options", default="", help='its command-line options, e.g. "--name_or_path M"')
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")


@contextmanager
def trainer_of(args: argparse.Namespace, trainer_class, config_class):
    """The trainer `args.config` and `args.options` build (as the command builds it), writing into a
    temporary folder that is gone when the block ends; torch at `args.threads`."""
    import torch

    from hydrappo.config import parse_config

    if args.threads:
        torch.set_num_threads(args.threads)
    config_path = Path(args.config)
    with tempfile.TemporaryDirectory() as output_dir:
        options = [*shlex.split(args.options), "--output_dir", output_dir, "--no_progress_bar"]
        yield trainer_class(parse_config(config_path, options, config_class), config_dir=config_path.parent)


def count_band_tokens(step, methods: tuple[str, ...]) -> list[int]:
    """Wrap the PPO step's `methods` (e.g. "experience_pass", "ppo_update") so that, while one of
    them runs, the tokens entering the first trainable layer (rows x columns of each pass) are
    appended to the list returned: what sharing a prompt saves. The test of shared prompts in the
    step counts with it too."""
    tokens: list[int] = []
    counting = [False]

    def counted(run):
        def run_counting(*args, **kwargs):
            counting[0] = True
            try:
                return run(*args, **kwargs)
            finally:
                counting[0] = False

        return run_counting

    for name in methods:
        setattr(step, name, counted(getattr(step, name)))

    def count(module, inputs, kwargs):
        if counting[0]:
            tokens.append((inputs[0] if inputs else kwargs["hidden_states"]).shape[:2].numel())

    hydra = step.hydra
    hydra.arch.layers[hydra.split_index].register_forward_pre_hook(count, with_kwargs=True)
    return tokens


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    run_arguments(parser, "train")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of one step of each setting")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch

    from hydrappo.config import Config
    from hydrappo.train.ppo import PPOTrainer

    with trainer_of(args, PPOTrainer, Config) as trainer:
        step = trainer.ppo_step
        config, hydra = step.config, step.hydra
        print(
            f"shared prompts on this model: {hydra.shares_prompts} ({hydra.prompt_sharing_problem or 'probe passed'})"
        )

        tokens = count_band_tokens(step, ("experience_pass", "ppo_update"))
        experience_seconds: list[float] = []
        run_experience = step.experience_pass

        def timed_experience(*pass_args, **pass_kwargs):
            start = time.perf_counter()
            try:
                return run_experience(*pass_args, **pass_kwargs)
            finally:
                experience_seconds.append(time.perf_counter() - start)

        step.experience_pass = timed_experience

        def one_step(shared: bool) -> dict[str, float]:
            config.ppo.share_prompts = shared
            experience_seconds.clear()
            start = time.perf_counter()
            stats, _ = step.run()
            total = time.perf_counter() - start
            return {
                "experience": sum(experience_seconds),
                "update": stats["time/update"],
                "step": total,
                "response tokens": stats["tokens/responses_len_mean"],
            }

        settings = {"shared": True, "whole rows": False}
        for shared in settings.values():
            one_step(shared)
        samples: dict[str, list[dict]] = {name: [] for name in settings}
        for round_index in range(args.repeats):
            names = list(settings) if round_index % 2 == 0 else list(reversed(settings))
            for name in names:
                tokens.clear()
                row = one_step(settings[name])
                row["tokens in"] = sum(tokens)
                samples[name].append(row)
                print(f"round {round_index}: {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()), flush=True)

    keys = (*PHASES, "tokens in", "response tokens")
    median = {name: {key: statistics.median(r[key] for r in rows) for key in keys} for name, rows in samples.items()}
    print(f"\nthreads {torch.get_num_threads()}; medians of {args.repeats} interleaved steps of each")
    print(f"{'':22} {'shared':>10} {'whole rows':>11} {'shared / whole':>15}")
    for key in keys:
        shared, whole = median["shared"][key], median["whole rows"][key]
        label = f"{key} (s)" if key in PHASES else key
        print(f"{label:22} {shared:10.2f} {whole:11.2f} {shared / whole:15.2f}")


if __name__ == "__main__":
    main()
