"""What the processes of test_distributed.py run: `python tests/helpers/distributed_worker.py MODE ...`.

ppo OUT                    one PPO step of every VARIANT on fixed responses, each into OUT/<variant>
die-after-first-save ARGS  `hydrappo ARGS`, every process killed in the step after its first checkpoint
heldout OUT EVAL [die|resume]  HELDOUT's run with held-out evaluation of EVAL on fixed rollouts, into OUT
                           (die: killed in the step after its first checkpoint; resume: continued)
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

from hydrappo.config import parse_config
from hydrappo.generation.responses import Responses
from hydrappo.train.distributed import end_process_group
from hydrappo.train.harness import Harness
from hydrappo.train.ppo import PPOTrainer
from hydrappo.train.ppo.step import PPOStep

from runs import TINY

# One PPO step of 8 responses: 2 epochs x 2 minibatches of 4, each split in 2 micro-batches per
# process; running score normalisation, whitening and the adaptive KL controller all see the batch.
# In float64, AdamW's eps 1e-6: the comparison with one process tests the logic, not the order of
# float sums (tests/helpers/bounds.py says why).
COMMON = [
    "--total_steps",
    "1",
    "--batch_size",
    "8",
    "--mini_batch_size",
    "4",
    "--gradient_accumulation_steps",
    "2",
    "--ppo_epochs",
    "2",
    "--learning_rate",
    "1e-4",
    "--score_normalization",
    "running",
    "--kl_controller",
    "adaptive",
    "--no_progress_bar",
    "--dtype",
    "float64",
    "--adam_eps",
    "1e-6",
]
VARIANTS = {
    "gae": [],
    # Groups of 2 stay on one process; the KL goes into the loss (k3), token-sum aggregation.
    "grpo": [
        "--advantage_estimator",
        "grpo",
        "--samples_per_prompt",
        "2",
        "--kl_penalty",
        "loss",
        "--loss_agg_mode",
        "seq-mean-token-sum",
    ],
    # Token returns whitened over the whole batch.
    "reinforce_pp": ["--advantage_estimator", "reinforce_pp", "--loss_agg_mode", "seq-mean-token-mean"],
    # Only the value head trains; with weight decay, a policy weight given a zero gradient would move.
    "critic_warmup": ["--critic_warmup_steps", "1", "--weight_decay", "0.1"],
    # A band in the middle of the 4 layers: the gradient crosses the frozen layer above it.
    "band": ["--trainable_layers", "1:3", "--train_lm_head", "false"],
}


def fixed_generate(trainer: PPOTrainer):
    """Replaces sampling: the responses of a prompt's group depend only on the prompt and the
    sample's place in its group, never on the process or the batch it lands in."""
    group = trainer.config.generation.samples_per_prompt
    max_new = trainer.config.generation.max_new_tokens
    eos, vocab = trainer.tokenizer.eos_token_id, len(trainer.tokenizer)

    def generate(prompt_ids, indices=None):  # (indices: the prompt rows, for episodes; unused here)
        responses, ended = [], []
        for row, prompt in enumerate(prompt_ids):
            rng = random.Random(f"{prompt}/{row % group}")
            tokens = [rng.randrange(4, vocab) for _ in range(rng.randint(1, max_new))]
            stop = rng.random() < 0.5
            if stop:
                tokens[-1] = eos
            responses.append(tokens)
            ended.append(stop)
        return Responses(prompt_ids=[list(p) for p in prompt_ids], response_ids=responses, ended=ended)

    return generate


def ppo_variants(out: Path) -> None:
    for name, options in VARIANTS.items():
        config = parse_config(TINY / "config.yaml", [*COMMON, *options, "--output_dir", str(out / name)])
        trainer = PPOTrainer(config, config_dir=TINY)
        trainer.ppo_step.generate = fixed_generate(trainer)
        trainer.train()


# 3 PPO steps on fixed rollouts (so that 1 and 2 processes train alike), a checkpoint at step 2,
# sampled held-out answers (the strict case: they draw random numbers) at steps 0, 2 and 3, in
# batches of 4: 12 held-out prompts make 3 batches, which 2 processes share unevenly.
HELDOUT = [
    "--total_steps",
    "3",
    "--save_every",
    "2",
    "--batch_size",
    "8",
    "--mini_batch_size",
    "4",
    "--ppo_epochs",
    "1",
    "--learning_rate",
    "1e-4",
    "--generation_batch_size",
    "4",
    "--eval_every",
    "2",
    "--eval_greedy",
    "false",
    "--no_progress_bar",
    "--dtype",
    "float64",
    "--adam_eps",
    "1e-6",
]


def heldout_run(out: Path, eval_prompts: str, how: str = "") -> None:
    config = parse_config(TINY / "config.yaml", [*HELDOUT, "--output_dir", str(out), "--eval_prompts", eval_prompts])
    trainer = PPOTrainer(config, config_dir=TINY)
    trainer.ppo_step.generate = fixed_generate(trainer)  # the rollouts; held-out answers are sampled as always
    if how == "die":
        real_save = trainer.harness.save

        def save_then_die(loop):
            path = real_save(loop)
            trainer.ppo_step.ppo_update = lambda *args: os._exit(3)  # killed in the middle of the next step
            return path

        trainer.harness.save = save_then_die
    trainer.train(resume=how == "resume")


def die_after_first_save(argv: list[str]) -> int:
    from hydrappo.cli import main

    real_save, saved = Harness.save, []

    def save(self, loop):
        path = real_save(self, loop)
        saved.append(self.step)
        return path

    def update(self, experience, plan):
        os._exit(3)  # killed in the middle of the step after the checkpoint

    Harness.save = save
    real_update = PPOStep.ppo_update
    PPOStep.ppo_update = lambda self, *args: update(self, *args) if saved else real_update(self, *args)
    return main(argv)


if __name__ == "__main__":
    mode, *rest = sys.argv[1:]
    if mode == "ppo":
        ppo_variants(Path(rest[0]))
        end_process_group(succeeded=True)  # as the command line ends a run
    elif mode == "heldout":
        heldout_run(Path(rest[0]), *rest[1:])
        end_process_group(succeeded=True)
    elif mode == "die-after-first-save":
        sys.exit(die_after_first_save(rest))
    else:
        raise SystemExit(f"unknown mode {mode}")
