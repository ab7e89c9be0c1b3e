"""Plan the GPU memory of PPO-RLHF: hydrappo's one trunk against the classic four models.

Per component (weights, reference copy, reward branch, value head, gradients, optimizer
state and fp32 master weights, KV cache, top-layer activations, log-prob chunks,
split-hidden cache) and per phase (generation, evaluation, update), for any model config
(a preset name, a config.json or a model directory) and training settings, with the GPU
sizes (8, 12, 16, 24, 48, 80 GB) each layout fits. Parameters are counted exactly on the
meta device; activations are traced from one decoder layer's forward (no memory used).

    python tools/estimate_memory.py llama-3.2-3b
    python tools/estimate_memory.py llama-3.1-8b --lora-rank 16 --batch-size 32
    python tools/estimate_memory.py path/to/config.json -N 4 --response-length 512 --json
    python tools/estimate_memory.py --largest            # largest preset per GPU size, full and LoRA
    python tools/estimate_memory.py --validate           # measure PPO steps on this CPU and compare

The same as `hydrappo memory ...`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    from hydrappo.cli import main as hydrappo

    return hydrappo(['memory', *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
