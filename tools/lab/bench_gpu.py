"""hydrappo's whole PPO step on a CUDA GPU, per model shape and sampler, in one command.

Random-weight models in the shapes of MODELS (folders with a config.json and a tokenizer:
SmolLM2-135M / 360M / 1.7B's, `model.random_init`), so nothing is downloaded: speed only,
no learning. Every run is `hydrappo train` of the sentiment example (VADER's reward) in a process of
its own; the table gives the median seconds of a step over the steps after the first (the first
one captures graphs, fills caches), split into rollout (sampling, the experience pass, the
reward) and update (the PPO epochs).

    python tools/lab/bench_gpu.py MODELS                          # every shape x generate, decode, graph
    python tools/lab/bench_gpu.py MODELS --runs n2_1p7 --samplers graph,generate --steps 4
    python tools/lab/bench_gpu.py MODELS --check-only             # only the replay-against-eager check

Shapes (the runs): main135, the sentiment example as it is (32 prompts x 24 new tokens, 4
layers trained) at 135M; n2_360 and n2_1p7, 32 x exactly 64 new tokens (min_new_tokens 64),
2 layers trained, at 360M and 1.7B. Before the runs, a check: the graph sampler's captured
replay gives the tokens of the same step run eagerly, greedy, at 360M, as the trainer runs it
(bf16, the trained layers in float32 under autocast), before and after an in-place change of
the trained weights. A run's own log ends with its reward and KL: with random weights the KL of
a sampler that draws from the policy stays near 0, never far below it.
With --budget seconds, a run that would not fit is skipped (SKIP in the table).
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
EXAMPLE = ROOT / "examples" / "sentiment" / "config.yaml"
# 32 rows x exactly 64 new tokens, 2 trained layers, 4 PPO epochs of 4 minibatches: the shape of
# the race against TRL's PPOTrainer (tools/lab/race_trl.py) at 360M and 1.7B.
RACE = [
    "--num_layers_unfrozen",
    "2",
    "--max_new_tokens",
    "64",
    "--min_new_tokens",
    "64",
    "--generation_batch_size",
    "32",
    "--batch_size",
    "32",
    "--mini_batch_size",
    "8",
    "--kl_controller",
    "fixed",
    "--learning_rate",
    "1e-6",
]
RUNS = {  # name: (model folder, options)
    "main135": ("s135", []),
    "n2_360": ("s360", RACE),
    "n2_1p7": ("s1p7", RACE),
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", type=Path, help="folder with s135/, s360/, s1p7/ (config.json + tokenizer each)")
    parser.add_argument("--runs", default=",".join(RUNS), help="which shapes, comma-separated")
    parser.add_argument("--samplers", default="generate,decode,graph")
    parser.add_argument("--steps", type=int, default=4, help="PPO steps per run (the first is not timed)")
    parser.add_argument("--timeout", type=int, default=180, help="seconds per run")
    parser.add_argument("--budget", type=int, default=0, help="seconds for everything (0: no limit)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench_gpu"))
    parser.add_argument("--check-only", action="store_true")
    parser.add_argument("--no-check", action="store_true", help="skip the replay-against-eager check")
    return parser.parse_args(argv)


def replay_matches_eager(model_dir: Path) -> str:
    """Greedy tokens of the graph sampler, captured and replayed, against the same step run
    eagerly, as the trainer samples: bf16 weights with the trained top layers in float32, under
    bf16 autocast; then again after an in-place change of the trained weights (an optimizer
    step), which the replay must see."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from hydrappo import HydraModel
    from hydrappo.config import GenerationArgs
    from hydrappo.generation.graph_decode import GraphDecoding
    from hydrappo.generation.responses import generate_responses

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU runs the code, not the graph
    model = (
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir), dtype=torch.bfloat16).to(device).eval()
    )
    hydra = HydraModel(model, 2)
    trained = [p for p in hydra.parameters() if p.requires_grad]
    for parameter in trained:  # as train/precision.py keeps them under mixed precision
        parameter.data = parameter.data.float()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    generator = torch.Generator().manual_seed(0)
    high = min(1000, model.config.vocab_size)
    prompts = [torch.randint(10, high, (int(n),), generator=generator).tolist() for n in torch.randint(8, 40, (24,))]
    args = GenerationArgs(max_new_tokens=48, generation_batch_size=24)
    replay, eager = GraphDecoding(hydra), GraphDecoding(hydra, capture=False)
    rounds = []
    for _ in range(2):
        with torch.autocast(device, dtype=torch.bfloat16):
            got = [
                generate_responses(hydra, tokenizer, prompts, args, greedy=True, record_split=True, loop=decoding.chunk)
                for decoding in (replay, eager)
            ]
        states = max(float((a - b).abs().max()) for a, b in zip(got[0].split_hidden, got[1].split_hidden))
        rounds.append((got[0].response_ids == got[1].response_ids, states, got[0].response_ids))
        with torch.no_grad():
            for parameter in trained:
                parameter.mul_(-1.5)  # an optimizer step's kind of change: in place
    graphs = type(replay.live.graph).__name__
    moved = rounds[0][2] != rounds[1][2]
    passed = (
        all(same and states == 0.0 for same, states, _ in rounds)
        and moved
        and (graphs == "CUDAGraph" or device == "cpu")
    )
    return (
        f"CHECK {'PASS' if passed else 'FAIL'}: captured replay vs eager step, greedy, 24 rows x 48 tokens at "
        f"{model_dir.name}, bf16 with float32 trained layers under autocast: graph {graphs}; before an in-place "
        f"weight change: tokens equal {rounds[0][0]}, max |state difference| {rounds[0][1]:.3g}; after it: tokens "
        f"equal {rounds[1][0]}, max |state difference| {rounds[1][1]:.3g}; the change moved the tokens: {moved}"
    )


def one_run(name: str, sampler: str, args) -> dict:
    folder, options = RUNS[name]
    out_dir = args.out / f"{name}_{sampler}"
    command = [
        sys.executable,
        "-m",
        "hydrappo",
        "train",
        str(EXAMPLE),
        "--name_or_path",
        str(args.models / folder),
        "--random_init",
        "true",
        "--total_steps",
        str(args.steps),
        "--sampler",
        sampler,
        *options,
        "--progress_bar",
        "false",
        "--save_every",
        "1000",
        "--output_dir",
        str(out_dir),
    ]
    start = time.perf_counter()
    with open(args.out / f"{name}_{sampler}.log", "w") as log:
        try:
            code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    wall = time.perf_counter() - start
    try:
        rows = [json.loads(line) for line in open(out_dir / "metrics.jsonl") if line.strip()]
    except OSError:
        rows = []
    timed = rows[1:] or rows
    if not timed:
        return {"name": name, "sampler": sampler, "code": code, "wall": wall}
    rollout = statistics.median(r["time/rollout"] for r in timed)
    update = statistics.median(r["time/update"] for r in timed)
    return {
        "name": name,
        "sampler": sampler,
        "code": code,
        "wall": wall,
        "steps": len(rows),
        "step": rollout + update,
        "rollout": rollout,
        "update": update,
        "length": statistics.median(r.get("tokens/responses_len_mean", 0) for r in timed),
        # a sampler that does not draw from the policy shows here: KL far below 0, reward off
        "kl": statistics.median(r.get("objective/kl", float("nan")) for r in timed),
    }


def table(results: list[dict]) -> str:
    lines = [
        "| model shape, sampler | step | rollout | update | response length | KL | steps | exit |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in results:
        if "step" in r:
            lines.append(
                f"| {r['name']}, {r['sampler']} | {r['step']:.2f} s | {r['rollout']:.2f} s | {r['update']:.2f} s "
                f"| {r['length']:.1f} | {r['kl']:.3f} | {r['steps']} | {r['code']} |"
            )
        else:
            lines.append(f"| {r['name']}, {r['sampler']} | - | - | - | - | - | - | {r['code']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    print("device", torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    if not args.no_check:
        print(replay_matches_eager(args.models / "s360"), flush=True)
    if args.check_only:
        return 0
    start, results = time.perf_counter(), []
    for name in args.runs.split(","):
        for sampler in args.samplers.split(","):
            if args.budget and time.perf_counter() - start + args.timeout > args.budget:
                results.append({"name": name, "sampler": sampler, "code": "SKIP (budget)"})
                continue
            results.append(one_run(name, sampler, args))
            print(f"RESULT {json.dumps(results[-1])}", flush=True)
            if results[-1]["code"] != 0:  # why it failed: the end of its log
                print("".join(open(args.out / f"{name}_{sampler}.log").readlines()[-8:]), flush=True)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
