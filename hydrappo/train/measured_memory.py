"""The measuring child of planner/validate.py: the peak memory of building a hydra of random
weights and of two PPO steps of hydrappo's trainer, in a process of its own.

    python -m hydrappo.train.measured_memory   < {"name": ..., "settings": {...}, "device": "cpu"}

It reads the request as JSON on stdin and prints the result (bytes) as JSON on its last stdout line.
The peak is reset once the hydra is built, and the second step's phases are measured one by one.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import torch
from transformers import AutoModelForCausalLM

from ..config import Config, DataArgs, GenerationArgs, ModelConfig, PPOArgs, RewardArgs, TrainArgs
from ..model import HydraModel
from ..model.quantize import quantize_frozen_trunk
from ..planner.settings import TrainingSettings
from ..planner.tokenizer import tokenizer_for_vocab
from ..planner.validate import Peak, peak_rss_bytes, return_freed_memory, validation_config
from .ppo import PPOTrainer


def validation_reward(samples, prompts, outputs):
    """The measured runs' reward: any function of the responses (its cost is not what is measured)."""
    return [len(o) / 100.0 for o in outputs]


def measure_steps(name: str, settings: dict, device: str = "cpu") -> dict:
    """In a fresh process: peak memory of building the hydra and of two PPO steps (RSS minus the RSS
    after imports on the CPU; allocated memory on a GPU)."""
    s = TrainingSettings(**settings)
    cuda = device.startswith("cuda")
    torch.manual_seed(0)
    config = validation_config(name)
    vocab = config.get_text_config().vocab_size
    tokenizer = tokenizer_for_vocab(vocab)
    tmp = tempfile.mkdtemp()
    with open(os.path.join(tmp, "prompts.jsonl"), "w") as handle:
        generator = torch.Generator().manual_seed(0)
        for _ in range(s.batch_size):
            words = torch.randint(4, vocab, (s.prompt_length,), generator=generator)
            handle.write(json.dumps({"prompt": " ".join(f"w{int(i)}" for i in words)}) + "\n")
    cfg = Config(
        model=ModelConfig(num_layers_unfrozen=s.num_layers_unfrozen, dtype=s.dtype),
        generation=GenerationArgs(
            max_new_tokens=s.response_length,
            min_new_tokens=s.response_length,
            generation_batch_size=s.generation_batch_size,
        ),
        ppo=PPOArgs(
            batch_size=s.batch_size,
            mini_batch_size=s.mini_batch_size,
            ppo_epochs=1,
            gradient_accumulation_steps=s.gradient_accumulation_steps,
            optimizer=s.optimizer,
        ),
        reward=RewardArgs(reward_fn="hydrappo.train.measured_memory:validation_reward"),
        data=DataArgs(prompts=os.path.join(tmp, "prompts.jsonl"), max_prompt_length=s.prompt_length),
        train=TrainArgs(
            output_dir=os.path.join(tmp, "out"),
            device=device,
            progress_bar=False,
            mixed_precision="bf16" if cuda and s.torch_dtype == torch.bfloat16 else "no",
        ),
    )
    peak = Peak(device)
    baseline = 0 if cuda else peak_rss_bytes()

    config._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(config, dtype=s.torch_dtype).eval()
    model.config.pad_token_id = tokenizer.pad_token_id
    hydra = HydraModel(model, s.num_layers_unfrozen, verify=s.trunk_quantization == "none")
    if s.trunk_quantization != "none":
        quantize_frozen_trunk(hydra, s.trunk_quantization, device=device)  # quantized onto the device
    else:
        hydra.to(device)
    trainer = PPOTrainer(cfg, hydra=hydra, tokenizer=tokenizer)
    after_build = peak.read() if cuda else peak_rss_bytes()
    if not cuda:
        return_freed_memory()  # the full-precision trunk a quantized one was made from
    resettable = peak.reset()
    trainer.train_step()
    # The optimizer state exists from the first step on: the second step is the steady
    # state. Its phases are measured one by one where the peak can be reset.
    phases: dict[str, int] = {}
    if resettable:

        def measured(function, label):
            def wrapper(*args, **kwargs):
                peak.reset()
                try:
                    return function(*args, **kwargs)
                finally:
                    phases[label] = max(phases.get(label, 0), peak.read() - baseline)

            return wrapper

        steps_peak = peak.read() - baseline
        # The trainer's phases are methods: wrap them on this instance.
        trainer.ppo_step.generate = measured(trainer.ppo_step.generate, "generate")
        trainer.ppo_step.experience_pass = measured(trainer.ppo_step.experience_pass, "evaluate")
        trainer.ppo_step.ppo_update = measured(trainer.ppo_step.ppo_update, "update")
        trainer.train_step()
        steps_peak = max(steps_peak, *phases.values())
    else:
        trainer.train_step()
        steps_peak = peak_rss_bytes() - baseline
    return {"baseline": baseline, "build": after_build - baseline, "peak": steps_peak, "phases": phases}


def main() -> None:
    """Entry point of the measuring child process: JSON in on stdin, JSON out on the last stdout line."""
    request = json.loads(sys.stdin.read())
    result = measure_steps(request["name"], request["settings"], request.get("device", "cpu"))
    print("\n" + json.dumps(result))


if __name__ == "__main__":
    main()
