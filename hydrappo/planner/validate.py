"""Check the memory planner against measured training: the peak resident memory of two PPO
steps of hydrappo's trainer on this CPU (float32) against the plan, per phase, for the plain
trunk with AdamW and for an int8 and a 4-bit trunk with 8-bit AdamW (model/quantize.py,
train/optimizers.py).

    hydrappo memory --validate                   # a SmolLM2-135M-shaped and a ~400M Llama, 3 settings (minutes)
    python -m hydrappo.planner.validate          # the same, with the options below
    python -m hydrappo.planner.validate --variants none/adamw --models smollm2-135m
    python -m hydrappo.planner.validate --variants none/adamw --models path/to/model.gguf   # any model train takes
    python -m hydrappo.planner.validate --device cuda   # bf16 on a GPU: torch.cuda.max_memory_allocated

Each model and setting is measured in a fresh child process (RSS after imports subtracted), which
train/measured_memory.py runs: it builds a PPOTrainer, a layer above the planner, so it is never
imported here.
The measured peak is that of the two PPO steps: the peak is reset once the hydra is built
(/proc/self/clear_refs), because a quantized trunk is loaded in full precision first, which
on a GPU happens on the CPU (storage/models.py build_hydra), and the plan is of training. The
phases are measured one by one the same way. On the CPU the planned peak is the plan plus what the
process itself holds once it computes (the pages of torch's kernels it runs, its threads), measured
on a model of ~0.1M parameters (RUNTIME_PROBE), ~155 MiB. Exit code 1 when a plan is more than 20% off.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import logging
import os
import re
import resource
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import torch
from transformers import AutoConfig

from .counts import load_model_config
from .plan import format_plan, plan_memory
from .presets import preset_config
from .settings import TrainingSettings

# The module run in each measuring child (a name, not an import: it sits a layer above the planner).
MEASURING_CHILD = "hydrappo.train.measured_memory"

VALIDATION_MODELS = {
    # SmolLM2-135M's shape (preset), and a ~400M Llama.
    "smollm2-135m": None,
    "llama-400m": dict(
        model_type="llama",
        hidden_size=1024,
        intermediate_size=4096,
        num_hidden_layers=24,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=64,
        vocab_size=32000,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    ),
}


# The CPU's own share of a measured peak: a model of ~0.1M parameters measured as the others are.
# Resident memory counts what the process itself takes once it computes (the pages of torch's CPU kernels
# it runs, its threads' stacks and workspaces): ~155 MiB over the plan on this machine (2026-11-28), for a
# model of any size. A GPU plan has no such term (its CUDA context is counted apart: planner/fit.py).
RUNTIME_PROBE = "runtime-probe"
RUNTIME_PROBE_CONFIG = dict(
    model_type="llama",
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=1024,
    max_position_embeddings=512,
    tie_word_embeddings=True,
)


def validation_config(name: str):
    """The config of a validation model, or of any model `hydrappo memory` takes (a preset, a config.json,
    whatever model.name_or_path takes: planner/counts.load_model_config); measured with random weights."""
    if name not in VALIDATION_MODELS and name != RUNTIME_PROBE:
        return load_model_config(name)
    values = RUNTIME_PROBE_CONFIG if name == RUNTIME_PROBE else VALIDATION_MODELS[name]
    if values is None:
        return preset_config(name)
    values = dict(values)
    return AutoConfig.for_model(values.pop("model_type"), **values)


# (trunk quantization, optimizer) pairs measured by default.
VARIANTS = {
    "none/adamw": ("none", "adamw"),
    "int8/adamw8bit": ("int8", "adamw8bit"),
    "4bit/adamw8bit": ("4bit", "adamw8bit"),
}


def validation_settings(**overrides) -> TrainingSettings:
    """What --validate runs on the CPU: float32, one PPO step of hydrappo's trainer."""
    values = dict(
        num_layers_unfrozen=2,
        dtype="float32",
        optimizer="adamw",
        batch_size=8,
        mini_batch_size=4,
        generation_batch_size=8,
        prompt_length=64,
        response_length=64,
        reward_model=False,
        device="cpu",  # the log-prob pass's blocks on the CPU (planner/settings.py)
    )
    values.update(overrides)
    return TrainingSettings(**values)


class Peak:
    """The peak memory of this process since the last reset: resident memory on the CPU
    (/proc/self/clear_refs, VmHWM), allocated memory on a GPU."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")

    def reset(self) -> bool:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            return True
        return_freed_memory()
        return reset_peak()

    def read(self) -> int:
        if self.cuda:
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated()
        return current_peak()


def peak_rss_bytes() -> int:
    """The peak resident size of this process's own memory: VmHWM where Linux reports it. Not getrusage's
    ru_maxrss first: Linux carries a parent's peak into a child through fork and exec, so a child of a
    large process (a test worker after several runs) reads its parent's peak and measures nothing."""
    try:
        return current_peak()
    except (OSError, AttributeError):  # no /proc (not Linux): the process's own maximum, in KiB on Linux
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def return_freed_memory() -> None:
    """Hand memory that Python has freed back to the operating system (glibc's malloc_trim), so
    that the resident size counts what training holds: glibc keeps freed blocks resident, e.g. the
    float32 weights a quantized trunk replaced (on SmolLM2-135M with an int8 trunk, 1286 MiB peak
    measured without this against 927 MiB with it), or a previous phase's temporaries. Called
    after the build and before each phase's peak reset."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the peak may then include freed memory
        pass


def reset_peak() -> bool:
    """Reset the process's peak resident size (Linux: /proc/self/clear_refs, value 5). False where
    the system has no such reset, or where its peak (VmHWM) reads below what is resident now, as some
    sandboxed kernels report it: the phases are then not measured one by one."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        return False
    try:
        return current_peak() >= 0.9 * resident_bytes() > 0  # read one after the other: pages may come between
    except (OSError, AttributeError, ValueError):
        return False


def current_peak() -> int:
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) * 1024


def resident_bytes() -> int:
    """What is resident now (/proc/self/statm, in pages), which every Linux reports."""
    resident_pages = int(Path("/proc/self/statm").read_text().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def peak_counters_work(size: int = 64 * 2**20) -> bool:
    """Whether this system reports the peak resident size (peak_rss_bytes) at least as high as
    what is resident after `size` bytes are written. Some sandboxes report a constant or zero, and
    --validate cannot measure there."""
    try:
        block = b"\x01" * size  # written, so resident
        resident = resident_bytes()
        del block
    except (OSError, ValueError, IndexError):
        return False
    return resident > size and peak_rss_bytes() >= 0.9 * resident


def measure(name: str, settings: TrainingSettings, timeout: float = 1800, device: str = "cpu") -> dict:
    """Run two measured PPO steps of `name` in a child process; returns bytes."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    result = subprocess.run(
        [sys.executable, "-m", MEASURING_CHILD],
        input=json.dumps({"name": name, "settings": asdict(settings), "device": device}),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    if result.returncode != 0:
        raise RuntimeError(f"measuring {name} failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    if measured["peak"] <= 0 or measured["build"] <= 0:
        raise RuntimeError(
            f"measuring {name} read a peak of {measured['peak']} bytes and a build of {measured['build']}: the peak "
            "resident size (/proc/self/status VmHWM, or getrusage ru_maxrss) did not rise while the child trained, "
            "so --validate cannot measure here; run it on a plain Linux machine or with --device cuda"
        )
    return measured


def validate(
    models: list[str] | None = None,
    settings: TrainingSettings | None = None,
    tolerance: float = 0.20,
    variants: list[str] | None = None,
    device: str = "cpu",
) -> list[dict]:
    """Planner's hydrappo peak against the measured peak of two PPO steps, per model and variant."""
    settings = settings or validation_settings()
    runtime = 0
    if not device.startswith("cuda"):  # the process's own memory, the same for every model: measured once
        probe = plan_memory(validation_config(RUNTIME_PROBE), settings, RUNTIME_PROBE)
        runtime = max(0, measure(RUNTIME_PROBE, settings, device=device)["peak"] - probe.hydra.peak)
    rows = []
    for name in models or list(VALIDATION_MODELS):
        for variant in variants or list(VARIANTS):
            quantization, optimizer = VARIANTS[variant]
            varied = replace(settings, trunk_quantization=quantization, optimizer=optimizer)
            plan = plan_memory(validation_config(name), varied, name)
            measured = measure(name, varied, device=device)
            predicted = plan.hydra.peak + runtime
            error = predicted / measured["peak"] - 1
            rows.append(
                {
                    "model": name if name in VALIDATION_MODELS else Path(name).name,
                    "variant": variant,
                    "parameters": plan.counts.total,
                    "predicted": predicted,
                    "measured": measured["peak"],
                    "measured_build": measured["build"],
                    "error": error,
                    "within": abs(error) <= tolerance,
                    "plan": plan,
                    "measured_phases": measured.get("phases", {}),
                    "runtime": runtime,
                    "planned_phases": {
                        phase: plan.hydra.static + plan.hydra.phase_bytes(phase) + runtime
                        for phase in ("generate", "evaluate", "update")
                    },
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m hydrappo.planner.validate", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models",
        nargs="+",
        default=list(VALIDATION_MODELS),
        help=f"{', '.join(VALIDATION_MODELS)} (the default), or any model `hydrappo memory` takes: a preset, a "
        "config.json, a model folder, a .gguf file, a bundled name (measured with random weights of its shape)",
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=list(VARIANTS),
        default=list(VARIANTS),
        help="trunk quantization / optimizer pairs",
    )
    parser.add_argument("--device", default="cpu", help="cpu (float32, peak RSS) or cuda (bfloat16, allocated memory)")
    parser.add_argument("--plans", action="store_true", help="also print each plan's components")
    args = parser.parse_args(argv)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    cuda = args.device.startswith("cuda")
    s = validation_settings(dtype="bfloat16", device="cuda") if cuda else validation_settings()
    if not cuda and not peak_counters_work():
        print(
            "error: this system does not report the peak resident size (getrusage ru_maxrss stays below what is "
            "resident), so --validate cannot measure here; run it on a plain Linux machine or with --device cuda",
            file=sys.stderr,
        )
        return 2
    try:
        rows = validate(args.models, s, variants=args.variants, device=args.device)
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(
        f"two PPO steps (the second measured phase by phase) on {'this GPU' if cuda else 'this CPU'}: {s.dtype}, "
        f"N={s.num_layers_unfrozen}, batch {s.batch_size}, mini-batch {s.mini_batch_size}, prompt {s.prompt_length} + "
        f"response {s.response_length}, reward function; {'allocated' if cuda else 'resident'} memory"
    )
    if rows and rows[0]["runtime"]:
        print(
            f"  planned = the plan + {rows[0]['runtime'] / 2**20:.0f} MiB the process itself holds once it computes "
            f"(measured on a {RUNTIME_PROBE}: a model of ~0.1M parameters, its plan subtracted)"
        )
    print(
        f"  {'model':<14} {'params':>8} {'trunk/optimizer':<16} {'phase':<9} {'planned':>10} {'measured':>10} {'error':>7}"
    )
    for row in rows:
        print(
            f"  {row['model']:<14} {row['parameters'] / 1e6:7.0f}M {row['variant']:<16} {'peak':<9} "
            f"{row['predicted'] / 2**20:7.0f}MiB {row['measured'] / 2**20:7.0f}MiB {row['error']:+7.1%} "
            f"{'ok' if row['within'] else 'OFF'}"
        )
        for phase, measured in row["measured_phases"].items():
            planned = row["planned_phases"][phase]
            print(
                f"  {'':<14} {'':>8} {'':<16} {phase:<9} {planned / 2**20:7.0f}MiB {measured / 2**20:7.0f}MiB "
                f"{planned / measured - 1:+7.1%}"
            )
    if args.plans:
        for row in rows:
            print()
            print(format_plan(row["plan"]).split("\n\nclassic")[0])
    return 0 if all(row["within"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
