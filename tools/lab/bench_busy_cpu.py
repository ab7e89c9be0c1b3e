"""How torch's CPU work slows when another process keeps a core busy, under the OpenMP runtime's
default waits and under hydrappo's (CPU_WAITS in hydrappo/__init__.py), side by side.

Each setting runs in a fresh subprocess (the runtime reads how its threads wait once, when torch
loads it), quiet and then with a process spinning beside it (`while True: pass`), and times

    matmul   a 64x576 @ 576x1536 float32 matmul (one MLP projection of a SmolLM2-135M-shaped
             layer on 64 tokens), the median of --reps calls;
    forward  a forward of 4 transformer layers (d_model 576, 9 heads, feed-forward 1536) on
             8 sequences of 64 tokens, no grad, the median of --steps calls.

Each "x" column is the busy time over the quiet time of the same setting; "cpu" is the CPU time
this process's threads spent per call (spinning counts, waiting for a core does not), which others'
load moves less than the wall time. On a machine others
share, "quiet" is only as quiet as they leave it: take several --rounds (the settings run in turn,
medians over the rounds) and note the load average the tool prints.

    python tools/lab/bench_busy_cpu.py                 # threads: torch's default
    python tools/lab/bench_busy_cpu.py --threads 2 --rounds 3 --steps 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def wait_settings() -> dict:
    """Setting name -> the wait variables it puts into a child's environment. In the parent only:
    `import hydrappo` loads torch, and in a child it would also put hydrappo's waits into the
    environment before torch loads, whatever the setting."""
    from hydrappo import CPU_WAITS

    return {
        "runtime default": {},
        "hydrappo (" + ", ".join(f"{k}={v}" for k, v in CPU_WAITS.items()) + ")": CPU_WAITS,
        "GOMP_SPINCOUNT=10000": {"GOMP_SPINCOUNT": "10000"},
    }


def measure(reps: int, steps: int) -> dict:
    """In the child: the median milliseconds of the matmul and of the forward."""
    import torch

    torch.manual_seed(0)
    a, b = torch.randn(64, 576), torch.randn(576, 1536)
    layer = torch.nn.TransformerEncoderLayer(576, 9, 1536, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False).eval()
    x = torch.randn(8, 64, 576)

    def median_ms(call, n: int) -> tuple[float, float]:
        """Wall and CPU milliseconds (this process, every thread) of one call, medians of `n`."""
        for _ in range(max(3, n // 10)):  # warm-up
            call()
        wall, cpu = [], []
        for _ in range(n):
            start, start_cpu = time.perf_counter(), time.process_time()
            call()
            wall.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
        return 1000 * statistics.median(wall), 1000 * statistics.median(cpu)

    with torch.no_grad():
        (matmul, matmul_cpu), (forward, forward_cpu) = (
            median_ms(lambda: a @ b, reps),
            median_ms(lambda: model(x), steps),
        )
    return {"matmul": matmul, "forward": forward, "matmul_cpu": matmul_cpu, "forward_cpu": forward_cpu}


def child(env_extra: dict, threads: int | None, reps: int, steps: int, busy: bool) -> dict:
    from hydrappo import CPU_WAIT_VARIABLES

    env = {k: v for k, v in os.environ.items() if k not in CPU_WAIT_VARIABLES}
    env.update(env_extra)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        done = subprocess.run(
            [sys.executable, __file__, "--child", "--reps", str(reps), "--steps", str(steps)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of the children (default: torch's)")
    parser.add_argument("--reps", type=int, default=100, help="matmul calls timed per child")
    parser.add_argument("--steps", type=int, default=10, help="forward calls timed per child")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of every setting, in turn; medians over them")
    parser.add_argument("--spincount", action="store_true", help="also GOMP_SPINCOUNT=10000 (GNU OpenMP only)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.reps, args.steps)))
        return
    settings = {
        name: extra for name, extra in wait_settings().items() if args.spincount or "GOMP_SPINCOUNT" not in extra
    }
    times = {(name, busy): [] for name in settings for busy in (False, True)}
    for round_ in range(args.rounds):  # the settings in turn, so that the machine's other load falls on each
        for name, extra in list(settings.items())[:: 1 if round_ % 2 == 0 else -1]:
            for busy in (False, True):
                times[name, busy].append(child(extra, args.threads, args.reps, args.steps, busy))
    print(
        f"cores: {os.cpu_count()}, OMP_NUM_THREADS: {args.threads or 'torch default'}, load average now: "
        f"{os.getloadavg()[0]:.1f}; median ms over {args.rounds} round(s)"
    )
    columns = ("matmul", "matmul_cpu", "forward", "forward_cpu")
    print(f"{'setting':<36}" + "".join(f"{c + ' quiet':>18}{'busy':>8}{'x':>6}" for c in columns))
    for name in settings:
        quiet, busy = ({c: statistics.median(r[c] for r in times[name, b]) for c in columns} for b in (False, True))
        print(f"{name:<36}" + "".join(f"{quiet[c]:>18.2f}{busy[c]:>8.2f}{busy[c] / quiet[c]:>6.1f}" for c in columns))


if __name__ == "__main__":
    main()
