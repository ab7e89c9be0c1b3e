"""What a distributed PPO run sends through the gradient all-reduce, against the whole model.

    python tools/lab/allreduce_bytes.py examples/sentiment/config.yaml [--model smollm2-135m]

Counts on the meta device (the memory planner's exact parameter counts: no memory, no
download) what hydrappo.train.distributed.ProcessGroup.reduce_gradients sums at every
optimizer step of the config's run: the float32 gradients of the trainable parameters (top-N
layers and value head, a trained lm_head or final norm, or the LoRA adapters) plus a 4-byte
flag; against the bytes of every parameter of the model, and against what a data-parallel
run of the classic layout reduces (the whole policy and the whole critic). `--model` is a
planner preset, a config.json or a model directory (default: the config's model, the bundled
SmolLM2-135M-Instruct read as the `smollm2-135m` preset).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

PRESET_OF = {"smollm2-135m-instruct": "smollm2-135m"}
MIB = 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="a hydrappo train config (YAML)")
    parser.add_argument("--model", help="planner preset, config.json or model directory (default: the config's model)")
    args = parser.parse_args()
    # hydrappo loads torch: imported once the arguments are read, so that --help answers at once
    from hydrappo.config import Config, parse_config
    from hydrappo.planner import TrainingSettings, count_parameters, load_model_config, plan_memory
    from hydrappo.planner.counts import value_head_parameters

    config = parse_config(args.config, [], Config)
    name = args.model or PRESET_OF.get(config.model.name_or_path, config.model.name_or_path)
    model_config = load_model_config(name)
    counts = count_parameters(model_config)
    settings = TrainingSettings(
        num_layers_unfrozen=config.model.num_layers_unfrozen,
        lora_rank=config.lora.lora_r,
        dtype="float32",
        train_lm_head=config.model.train_lm_head,
        train_final_norm=config.model.train_final_norm,
    )
    plan = plan_memory(model_config, settings, name, counts)
    trainable = plan.hydra.trainable_parameters
    if not config.ppo.uses_critic:  # the estimator's row (algo/advantages.py ESTIMATORS) says it has no value head
        trainable -= value_head_parameters(counts.hidden_size)
    per_update = 4 * trainable + 4  # float32 gradients + the non-finite flag
    whole = 4 * counts.total
    ppo = config.ppo
    updates = ppo.ppo_epochs * (ppo.batch_size // ppo.mini_batch_size)
    print(
        f"model {name}: {counts.total:,} parameters = {whole:,} bytes in float32 ({whole / MIB:.1f} MiB), "
        f"{whole // 2 / MIB:.1f} MiB in bf16"
    )
    print(
        f"trainable with num_layers_unfrozen={config.model.num_layers_unfrozen}, lora_r={config.lora.lora_r}, "
        f"estimator {ppo.advantage_estimator}: {trainable:,} parameters"
    )
    print(
        f"gradient all-reduce per optimizer step: {per_update:,} bytes ({per_update / MIB:.1f} MiB) = "
        f"{per_update / whole:.3f} x the whole model's float32 parameter bytes"
    )
    print(
        f"per PPO step ({ppo.ppo_epochs} epochs x {ppo.batch_size // ppo.mini_batch_size} minibatches = {updates} "
        f"optimizer steps): {updates * per_update / MIB:.1f} MiB"
    )
    classic = 4 * plan.classic.trainable_parameters
    print(
        f"the classic layout in DDP (whole policy + whole critic): {classic / MIB:.1f} MiB per optimizer step, "
        f"{classic / per_update:.1f} x hydrappo's"
    )


if __name__ == "__main__":
    main()
