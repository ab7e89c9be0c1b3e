"""One GRPO iteration (no critic, KL coefficient 0) against one PPO iteration at the same batch,
time and memory, side by side in one process.

    python tools/lab/bench_critic_free.py                 # SmolLM2-135M-shaped Llama, random weights
    python tools/lab/bench_critic_free.py --num-layers 6  # a quick run

Three trainers share one process and the same work (prompts, responses of exactly --new-tokens
tokens, PPO epochs and mini-batches); their steps are interleaved and timed per phase (median):
  ppo           advantage_estimator gae: value head, reference pass, KL in the reward (0.05)
  grpo+kl       grpo, G samples per prompt, no value head, k3 KL in the loss (0.05): reference pass
  grpo          grpo, no value head, KL coefficient 0: the reference branch never runs
Memory: the bytes of trainable parameters, their gradients and the AdamW state (tensor sizes),
and the peak resident memory a step adds (Linux: /proc/self/clear_refs resets the peak).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

# torch, transformers and hydrappo are imported where they are used, so that --help answers at once.
MIB = 2**20


def length_reward(samples, prompts, outputs):
    return [len(set(o.split())) / 10.0 for o in outputs]


def build(args, name: str, estimator: str, kl_coef: float, kl_penalty: str, group: int, prompts: str, out: str):
    import torch
    from transformers import AutoModelForCausalLM

    from hydrappo.config import Config, DataArgs, GenerationArgs, ModelConfig, PPOArgs, RewardArgs, TrainArgs
    from hydrappo.model import HydraModel
    from hydrappo.planner.presets import preset_config
    from hydrappo.planner.tokenizer import tokenizer_for_vocab
    from hydrappo.train.ppo import PPOTrainer

    torch.manual_seed(0)
    config = preset_config(args.model, **({"num_hidden_layers": args.num_layers} if args.num_layers else {}))
    config._attn_implementation = "sdpa"
    tokenizer = tokenizer_for_vocab(config.vocab_size)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.config.pad_token_id = tokenizer.pad_token_id
    hydra = HydraModel(model, args.num_layers_unfrozen)
    run = Config(
        model=ModelConfig(num_layers_unfrozen=args.num_layers_unfrozen),
        generation=GenerationArgs(
            max_new_tokens=args.new_tokens,
            min_new_tokens=args.new_tokens,
            generation_batch_size=args.batch,
            samples_per_prompt=group,
        ),
        ppo=PPOArgs(
            batch_size=args.batch,
            mini_batch_size=args.mini_batch,
            ppo_epochs=args.ppo_epochs,
            advantage_estimator=estimator,
            init_kl_coef=kl_coef,
            kl_controller="fixed",
            kl_penalty=kl_penalty,
        ),
        reward=RewardArgs(reward_fn=f"{Path(__file__).resolve()}:length_reward"),
        data=DataArgs(prompts=prompts, max_prompt_length=args.prompt_len),
        train=TrainArgs(output_dir=f"{out}/{name}", device="cpu", mixed_precision="no", progress_bar=False),
    )
    return PPOTrainer(run, hydra=hydra, tokenizer=tokenizer)


def static_bytes(trainer) -> dict:
    import torch

    params = [p for p in trainer.hydra.parameters() if p.requires_grad]
    state = [t for s in trainer.harness.optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    size = lambda tensors: sum(t.numel() * t.element_size() for t in tensors)  # noqa: E731
    return {"trainable": size(params), "gradients": size(params), "adamw": size(state)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--num-layers", type=int, default=None, help="keep only the first L decoder layers")
    parser.add_argument("--num-layers-unfrozen", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16, help="responses per iteration")
    parser.add_argument("--group", type=int, default=4, help="GRPO's samples per prompt")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--ppo-epochs", type=int, default=4)
    parser.add_argument("--mini-batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args(argv)
    import torch
    import transformers

    from hydrappo.planner.validate import current_peak, reset_peak  # the peak resident size, reset and read

    if args.threads:
        torch.set_num_threads(args.threads)

    transformers.logging.set_verbosity_error()
    tmp = tempfile.mkdtemp()
    prompts = f"{tmp}/prompts.jsonl"
    generator = torch.Generator().manual_seed(0)
    with open(prompts, "w") as handle:
        for _ in range(64):
            words = torch.randint(4, 1000, (args.prompt_len,), generator=generator)
            handle.write(json.dumps({"prompt": " ".join(f"w{int(i)}" for i in words)}) + "\n")
    trainers = {
        "ppo": build(args, "ppo", "gae", 0.05, "reward", 1, prompts, tmp),
        "grpo+kl": build(args, "grpo_kl", "grpo", 0.05, "loss", args.group, prompts, tmp),
        "grpo": build(args, "grpo", "grpo", 0.0, "loss", args.group, prompts, tmp),
    }
    phases = ("generate", "evaluate", "update", "total")
    times = {name: {phase: [] for phase in phases} for name in trainers}
    peaks = {name: [] for name in trainers}
    for repeat in range(args.repeats + 1):  # the first round warms up
        for name, trainer in trainers.items():
            clock = {}
            for phase, method in (("generate", "generate"), ("evaluate", "evaluate"), ("update", "ppo_update")):
                real = getattr(type(trainer), method)

                def timed(*a, _real=real, _phase=phase, _trainer=trainer, _clock=clock, **k):
                    import time

                    start = time.perf_counter()
                    try:
                        return _real(_trainer, *a, **k)
                    finally:
                        _clock[_phase] = time.perf_counter() - start

                setattr(trainer, method, timed)
            resident = current_peak() if reset_peak() else None
            import time

            start = time.perf_counter()
            trainer.train_step()
            clock["total"] = time.perf_counter() - start
            trainer.harness.step += 1
            if repeat:
                for phase in phases:
                    times[name][phase].append(clock[phase])
                if resident is not None:
                    peaks[name].append(current_peak() - resident)
    print(
        f"model {args.model}{f' ({args.num_layers} layers)' if args.num_layers else ''}, N = {args.num_layers_unfrozen}, "
        f"{args.batch} responses ({args.batch // args.group} prompts x G = {args.group} for GRPO) x {args.new_tokens} "
        f"new tokens, {args.ppo_epochs} epochs of mini-batches of {args.mini_batch}; median of {args.repeats} "
        f"interleaved steps, {torch.get_num_threads()} threads"
    )
    print(f"\n{'seconds':<10}" + "".join(f"{name:>10}" for name in trainers) + f"{'grpo/ppo':>10}")
    for phase in phases:
        medians = {name: statistics.median(times[name][phase]) for name in trainers}
        print(
            f"{phase:<10}"
            + "".join(f"{m:10.2f}" for m in medians.values())
            + f"{medians['grpo'] / medians['ppo']:10.3f}"
        )
    print(f"\n{'MiB':<22}" + "".join(f"{name:>10}" for name in trainers) + f"{'grpo/ppo':>10}")
    sizes = {name: static_bytes(trainer) for name, trainer in trainers.items()}
    for key in ("trainable", "gradients", "adamw"):
        print(
            f"{key:<22}"
            + "".join(f"{sizes[n][key] / MIB:10.1f}" for n in trainers)
            + f"{sizes['grpo'][key] / sizes['ppo'][key]:10.3f}"
        )
    if all(peaks.values()):
        steps = {name: statistics.median(values) for name, values in peaks.items()}
        print(
            f"{'peak RSS added by step':<22}"
            + "".join(f"{steps[n] / MIB:10.1f}" for n in trainers)
            + f"{steps['grpo'] / steps['ppo']:10.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
