"""Check the memory planner against measured training: the peak resident memory of two PPO
steps of hydrappo's trainer on this CPU (float32) against the plan, per phase.

    python tools/validate_memory.py              # a SmolLM2-135M-shaped and a ~400M Llama (minutes)
    hydrappo memory --validate                   # the same, from a source checkout

Each model is measured in a fresh child process (peak RSS after imports subtracted), and
the phases are measured one by one where the kernel lets the peak be reset
(/proc/self/clear_refs). Exit code 1 when a plan is more than 20% off.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from hydrappo.config import Config, DataArgs, GenerationArgs, ModelConfig, PPOArgs, RewardArgs, TrainArgs
from hydrappo.model import HydraModel
from hydrappo.planner.plan import format_plan, plan_memory
from hydrappo.planner.presets import preset_config
from hydrappo.planner.settings import TrainingSettings
from hydrappo.train.ppo import PPOTrainer


VALIDATION_MODELS = {
    # SmolLM2-135M's shape (preset), and a ~400M Llama.
    "smollm2-135m": None,
    "llama-400m": dict(
        model_type="llama", hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
        num_key_value_heads=8, head_dim=64, vocab_size=32000, max_position_embeddings=4096, tie_word_embeddings=True,
    ),
}


def validation_config(name: str):
    from transformers import AutoConfig

    values = VALIDATION_MODELS[name]
    if values is None:
        return preset_config(name)
    values = dict(values)
    return AutoConfig.for_model(values.pop("model_type"), **values)


def validation_settings(**overrides) -> TrainingSettings:
    """What --validate runs on the CPU: float32, one PPO step of hydrappo's trainer."""
    values = dict(num_layers_unfrozen=2, dtype="float32", optimizer="adamw", batch_size=8, mini_batch_size=4,
                  generation_batch_size=8, prompt_length=64, response_length=64, reward_model=False)  # fmt: skip
    values.update(overrides)
    return TrainingSettings(**values)


def _peak_rss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def validation_reward(samples, prompts, outputs):
    return [len(o) / 100.0 for o in outputs]


def _measure_child(name: str, settings: dict) -> dict:
    """In a fresh process: peak RSS of building the hydra and two PPO steps, minus the RSS after imports."""
    import tempfile

    from transformers import AutoModelForCausalLM

    s = TrainingSettings(**settings)
    torch.manual_seed(0)
    config = validation_config(name)
    vocab = config.get_text_config().vocab_size
    tokenizer = word_tokenizer(vocab)
    tmp = tempfile.mkdtemp()
    with open(os.path.join(tmp, "prompts.jsonl"), "w") as handle:
        generator = torch.Generator().manual_seed(0)
        for _ in range(s.batch_size):
            words = torch.randint(4, vocab, (s.prompt_length,), generator=generator)
            handle.write(json.dumps({"prompt": " ".join(f"w{int(i)}" for i in words)}) + "\n")
    cfg = Config(
        model=ModelConfig(num_layers_unfrozen=s.num_layers_unfrozen, dtype=s.dtype),
        generation=GenerationArgs(max_new_tokens=s.response_length, min_new_tokens=s.response_length,
                                  generation_batch_size=s.generation_batch_size),
        ppo=PPOArgs(batch_size=s.batch_size, mini_batch_size=s.mini_batch_size, ppo_epochs=1,
                    gradient_accumulation_steps=s.gradient_accumulation_steps),
        reward=RewardArgs(reward_fn=f"{Path(__file__).resolve()}:validation_reward"),
        data=DataArgs(prompts=os.path.join(tmp, "prompts.jsonl"), max_prompt_length=s.prompt_length),
        train=TrainArgs(output_dir=os.path.join(tmp, "out"), device="cpu", mixed_precision="no", progress_bar=False),
    )  # fmt: skip
    baseline = _peak_rss_bytes()

    config._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(config, dtype=s.torch_dtype).eval()
    model.config.pad_token_id = tokenizer.pad_token_id
    hydra = HydraModel(model, s.num_layers_unfrozen)
    trainer = PPOTrainer(cfg, hydra=hydra, tokenizer=tokenizer)
    after_build = _peak_rss_bytes()
    trainer.train_step()
    # The optimizer state exists from the first step on: the second step is the steady
    # state. Its phases are measured one by one where the kernel lets us reset the peak.
    phases: dict[str, int] = {}
    if _reset_peak():

        def measured(function, label):
            def wrapper(*args, **kwargs):
                _reset_peak()
                try:
                    return function(*args, **kwargs)
                finally:
                    phases[label] = _current_peak() - baseline

            return wrapper

        # The trainer's phases are methods: wrap them on this instance.
        trainer.generate = measured(trainer.generate, "generate")
        trainer.evaluate = measured(trainer.evaluate, "evaluate")
        trainer.ppo_update = measured(trainer.ppo_update, "update")
    trainer.train_step()
    return {"baseline": baseline, "build": after_build - baseline, "peak": _peak_rss_bytes() - baseline, "phases": phases}


def _reset_peak() -> bool:
    """Reset the process's peak resident size (Linux: /proc/self/clear_refs, value 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def _current_peak() -> int:
    import re

    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) * 1024


def _measure_main() -> None:
    """Entry point of the measuring child process: JSON in on stdin, JSON out on the last stdout line."""
    request = json.loads(sys.stdin.read())
    result = _measure_child(request["name"], request["settings"])
    print("\n" + json.dumps(result))


def word_tokenizer(vocab_size: int):
    """A word-level tokenizer whose ids cover the whole vocabulary ('w4' .. 'wN')."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3}
    vocab.update({f"w{i}": i for i in range(4, vocab_size)})
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>")
    tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def measure(name: str, settings: TrainingSettings, timeout: float = 1800) -> dict:
    """Run two measured PPO steps of `name` in a child process; returns bytes."""
    import subprocess

    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    result = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--measure-child"],
        input=json.dumps({"name": name, "settings": asdict(settings)}),
        capture_output=True, text=True, timeout=timeout, env=env,
    )
    if result.returncode != 0:
        raise RuntimeError(f"measuring {name} failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def validate(models: list[str] | None = None, settings: TrainingSettings | None = None, tolerance: float = 0.20) -> list[dict]:
    """Planner's hydrappo peak against the measured peak RSS of one PPO step on this CPU."""
    settings = settings or validation_settings()
    rows = []
    for name in models or list(VALIDATION_MODELS):
        plan = plan_memory(validation_config(name), settings, name)
        measured = measure(name, settings)
        predicted = plan.hydra.peak
        error = predicted / measured["peak"] - 1
        rows.append({"model": name, "parameters": plan.counts.total, "predicted": predicted,
                     "measured": measured["peak"], "measured_build": measured["build"], "error": error,
                     "within": abs(error) <= tolerance, "plan": plan, "measured_phases": measured.get("phases", {}),
                     "planned_phases": {phase: plan.hydra.static + plan.hydra.phase_bytes(phase)
                                        for phase in ("generate", "evaluate", "update")}})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    import logging

    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--measure-child"]:
        _measure_main()
        return 0
    logging.getLogger("transformers").setLevel(logging.ERROR)
    rows = validate(settings=validation_settings())
    s = validation_settings()
    print(f"one PPO step (two measured, steady state) on this CPU: float32, N={s.num_layers_unfrozen}, batch {s.batch_size}, "
          f"mini-batch {s.mini_batch_size}, prompt {s.prompt_length} + response {s.response_length}, adamw, "
          "reward function")  # fmt: skip
    print(f"  {'model':<14} {'params':>8} {'phase':<9} {'planned':>10} {'measured':>10} {'error':>7}")
    for row in rows:
        print(f"  {row['model']:<14} {row['parameters'] / 1e6:7.0f}M {'peak':<9} {row['predicted'] / 2**20:7.0f}MiB "
              f"{row['measured'] / 2**20:7.0f}MiB {row['error']:+7.1%} {'ok' if row['within'] else 'OFF'}")  # fmt: skip
        for phase, measured in row["measured_phases"].items():
            planned = row["planned_phases"][phase]
            print(f"  {'':<14} {'':>8} {phase:<9} {planned / 2**20:7.0f}MiB {measured / 2**20:7.0f}MiB "
                  f"{planned / measured - 1:+7.1%}")  # fmt: skip
    for row in rows:
        print()
        print(format_plan(row["plan"]).split("\n\nclassic")[0])
    return 0 if all(row["within"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
