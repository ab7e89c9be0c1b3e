"""The main job's whole PPO step before and after the step-speed work, side by side in one process.

    before  the step as of commit 3916af5: transformers' `generate` samples (GenerateSampler), the
            chunked log-probs of that commit (bench_logprobs.previous_token_logprobs) and torch's
            AdamW as a loop of elementwise operations per tensor;
    after   the trainer's defaults: hydrappo's decode loop (generation.sampler: auto on the CPU),
            the fused lm_head log-probs and torch's fused AdamW kernel.

One PPOTrainer (tools/lab/bench_ppo.py's HydraLayout: a SmolLM2-135M-shaped model with seeded random
weights, the main job's shape by default: 32 responses x (40 + 24) tokens, N = 4, 4 epochs of
mini-batch 8, temperature 0.7) runs both, the two alternating step by step (the order reversed
every round), medians of --repeats after one warm-up step each; per phase: sampling, the
experience pass (with scoring and advantages), the update, and the whole step; wall seconds and
the CPU seconds of this process (which on a shared machine move less: waiting for a core is not
counted). Random weights rarely emit EOS, so every row runs to the limit: the decode loop's
ended-row saving is not in these numbers.

    python tools/lab/bench_step.py --threads 2
    python tools/lab/bench_step.py --threads 1 --batch 8 --prompt-len 32 --new-tokens 32 -N 2   # the race shape
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from profile_step import step_shape_arguments  # noqa: E402 (imports no torch)

PHASES = ("generate", "experience", "update", "total")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    step_shape_arguments(parser)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    # torch, the other benchmarks and hydrappo load once the options are read: --help answers at once
    import torch
    from bench_logprobs import previous_token_logprobs
    from bench_ppo import HydraLayout, build_base_model, configure

    import hydrappo.model.hydra as hydra_module
    from hydrappo.generation.samplers import GenerateSampler
    from hydrappo.model.logprobs import token_logprobs

    configure(args)
    # The learning-rate schedule belongs to the trainer's optimizer; with the other one swapped in it
    # warns that it steps without its optimizer (the rate is constant here).
    warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step()`")
    layout = HydraLayout(build_base_model(args), args, reward_branch=False)  # the main job scores with a function
    trainer = layout.trainer
    hyper = layout.optimizer.defaults
    adamw_loop = torch.optim.AdamW(
        layout.params, lr=hyper["lr"], betas=hyper["betas"], eps=hyper["eps"], weight_decay=hyper["weight_decay"]
    )  # torch's default on the CPU
    settings = {  # name: (sampler, log-prob function, optimizer)
        "before": (GenerateSampler(layout.hydra, trainer.tokenizer), previous_token_logprobs, adamw_loop),
        "after": (trainer.ppo_step.rollout_sampler, token_logprobs, layout.optimizer),
    }
    print(
        f"after: sampler {trainer.ppo_step.rollout_sampler.name}, fused AdamW {layout.optimizer.defaults.get('fused')}; "
        f"threads {torch.get_num_threads()}"
    )

    def step(name: str) -> dict[str, float]:
        sampler, logprobs, optimizer = settings[name]
        kept = trainer.ppo_step.rollout_sampler, hydra_module.token_logprobs, trainer.harness.optimizer
        trainer.ppo_step.rollout_sampler, hydra_module.token_logprobs, trainer.harness.optimizer = (
            sampler,
            logprobs,
            optimizer,
        )
        try:
            cpu = time.process_time()
            seconds = layout.iteration()
            return {**seconds, "cpu": time.process_time() - cpu}
        finally:
            trainer.ppo_step.rollout_sampler, hydra_module.token_logprobs, trainer.harness.optimizer = kept

    for name in settings:  # warm-up
        step(name)
    samples: dict[str, list[dict]] = {name: [] for name in settings}
    for round_index in range(args.repeats):
        for name in settings if round_index % 2 == 0 else reversed(list(settings)):
            samples[name].append(step(name))
    median = {
        name: {key: statistics.median(s[key] for s in rows) for key in (*PHASES, "cpu")}
        for name, rows in samples.items()
    }
    print(
        f"{args.batch} responses x ({args.prompt_len} + {args.new_tokens}) tokens, N = {args.num_layers_unfrozen}, "
        f"{args.ppo_epochs} epochs of mini-batch {args.mini_batch}; medians of {args.repeats} interleaved steps"
    )
    print(f"{'phase':12} {'before s':>9} {'after s':>9} {'after / before':>15}")
    for key in (*PHASES, "cpu"):
        label = "step, CPU s" if key == "cpu" else key
        before, after = median["before"][key], median["after"][key]
        print(f"{label:12} {before:9.2f} {after:9.2f} {after / before:15.2f}")


if __name__ == "__main__":
    main()
