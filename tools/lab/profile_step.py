"""Where the time of one PPO step goes: prefill, decode per token (against the FLOP bound of
the model on this CPU), the operators inside generation, stop handling, packing, the
experience pass and the update, for hydrappo's real code path (tools/lab/bench_ppo.py's
HydraLayout: a PPOTrainer's own generate, make_experience and ppo_update on the cached split),
and each phase against its FLOP floor (its matmul FLOPs at the measured matmul rate).

    python tools/lab/profile_step.py                                   # the main job's shape
    python tools/lab/profile_step.py --batch 64 --new-tokens 32 -N 2   # a GRPO shape: 8 prompts x 8 samples

Defaults follow examples/sentiment/config.yaml: a SmolLM2-135M-shaped Llama with random
weights, 32 responses of exactly 24 new tokens, N = 4, 40-token prompts, 4 PPO epochs of
mini-batch 8 (the example's mini_batch_size; before 2026-11-25 this tool's default was 4: the
same FLOPs in twice the optimizer steps), log-probs at temperature 0.7 (the example's; before
2026-11-25: 1). Times are medians of --repeats after one warm-up; on a shared machine read them
as indicative and compare phases within one run. The floors take the median of the 1024^3
matmul rate measured before each phase and at the end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent))

if TYPE_CHECKING:
    from bench_ppo import HydraLayout

# torch, bench_ppo and hydrappo are imported where they are used, so that --help answers at once
# (and bench_logprobs.py takes step_shape_arguments without them).

MATMUL_OPS = (
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::matmul",
    "aten::linear",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::scaled_dot_product_attention",
)
SAMPLING_OPS = (
    "aten::softmax",
    "aten::_softmax",
    "aten::multinomial",
    "aten::topk",
    "aten::sort",
    "aten::cumsum",
    "aten::div",
    "aten::argmax",
    "aten::log_softmax",
)


def step_shape_arguments(parser: argparse.ArgumentParser) -> None:
    """The model and the PPO step's shape (the main job's by default); bench_logprobs.py takes them too."""
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--num-layers", type=int, default=None)
    parser.add_argument("-N", "--num-layers-unfrozen", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32, help="responses per step")
    parser.add_argument("--prompt-len", type=int, default=40)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--ppo-epochs", type=int, default=4)
    parser.add_argument("--mini-batch", type=int, default=8)
    parser.add_argument("--samples-per-prompt", type=int, default=1, help="G: each prompt in G consecutive rows")
    parser.add_argument("--temperature", type=float, default=0.7, help="of the log-probs, as the example samples")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    step_shape_arguments(parser)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    return parser.parse_args(argv)


def median_seconds(function, repeats: int) -> float:
    function()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_gflops(m: int, k: int, n: int, repeats: int = 20) -> float:
    import torch

    a, b = torch.randn(m, k), torch.randn(k, n)
    seconds = median_seconds(lambda: [a @ b for _ in range(repeats)], 3) / repeats
    return 2 * m * k * n / seconds / 1e9


def decode_flops_per_token(model, rows: int) -> int:
    """Multiply-adds of one decode step, counted as 2 FLOPs each: every weight matrix of the
    decoder layers and the lm_head once per row (attention over the cache is left out)."""
    layers = sum(p.numel() for name, p in model.named_parameters() if p.dim() == 2 and "embed_tokens" not in name)
    head = model.get_output_embeddings().weight.numel()
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    return 2 * rows * (layers + (head if tied else 0))


def flop_floors(layout: HydraLayout, args, response_tokens: int) -> dict[str, float]:
    """Matmul FLOPs of each phase (2 per multiply-add; attention scores and norms left out, as in
    decode_flops_per_token), for this layout: prompts of --prompt-len, `response_tokens` response
    tokens over all rows, N top layers, a reference copy and a reward branch of N layers each.
        prefill     every prompt token through all L layers, one lm_head row per row
        decode      per new token of all rows: decode_flops_per_token
        experience  the recorded split: policy, reference and reward branch (N layers each) over
                    every token, the value head, two lm_heads (policy, reference) over the responses
        update      per epoch: the policy's N layers forward and backward (input and weight
                    gradients: 3x forward) over every token, the frozen lm_head forward and its
                    input gradient (2x) over the responses, the value head (3x)"""
    model = layout.hydra.model
    layer = sum(p.numel() for p in layout.hydra.arch.layers[0].parameters() if p.dim() == 2)
    head = model.get_output_embeddings().weight.numel()
    hidden = model.config.hidden_size
    value_head = hidden * 2 * hidden + 2 * hidden
    n, total_layers = args.num_layers_unfrozen, model.config.num_hidden_layers
    prompt_tokens = args.batch * args.prompt_len
    tokens = prompt_tokens + response_tokens
    return {
        "prefill": 2 * (prompt_tokens * total_layers * layer + args.batch * head),
        "decode, per token (all rows)": decode_flops_per_token(model, args.batch),
        "experience": 2 * (3 * tokens * n * layer + tokens * value_head + 2 * response_tokens * head),
        "update": args.ppo_epochs * 2 * (3 * tokens * n * layer + 2 * response_tokens * head + 3 * tokens * value_head),
    }


def operator_shares(layout: HydraLayout) -> dict[str, float]:
    """Self CPU time of generation's operators by kind, as shares of the wall time."""
    from torch.profiler import ProfilerActivity, profile

    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        layout.rollout()
    wall = time.perf_counter() - start
    by_kind = {"matmul and attention": 0.0, "sampling and logits": 0.0, "other operators": 0.0}
    for event in prof.key_averages():
        seconds = event.self_cpu_time_total / 1e6
        if event.key in MATMUL_OPS:
            by_kind["matmul and attention"] += seconds
        elif event.key in SAMPLING_OPS:
            by_kind["sampling and logits"] += seconds
        else:
            by_kind["other operators"] += seconds
    shares = {kind: seconds / wall for kind, seconds in by_kind.items()}
    shares["outside operators (Python, generate's loop)"] = max(0.0, 1 - sum(shares.values()))
    return shares


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch
    from bench_ppo import HydraLayout, build_base_model, configure, generation_args

    from hydrappo.generation.responses import generate_responses
    from hydrappo.generation.stops import first_stop
    from hydrappo.data import pack_sequences

    configure(args)
    layout = HydraLayout(build_base_model(args), args)
    model = layout.hydra.model
    gen = generation_args(args)
    one_token = generation_args(argparse.Namespace(**{**vars(args), "new_tokens": 1}))
    responses = layout.rollout()

    # The 1024^3 matmul rate before each phase and at the end; the floors use their median (on a
    # shared machine the load moves it by up to 2x within minutes: one measurement is not enough).
    rates = [matmul_gflops(1024, 1024, 1024)]
    phases = {
        "generate": median_seconds(layout.rollout, args.repeats),
        "prefill (generate 1 token)": median_seconds(
            lambda: generate_responses(layout.hydra, layout.tokenizer, layout.prompts, one_token), args.repeats
        ),
        "stop handling (first_stop, no stop strings)": median_seconds(
            lambda: [first_stop(row, {layout.tokenizer.eos_token_id}, [], None) for row in responses.response_ids],
            args.repeats,
        ),
        "packing": median_seconds(
            lambda: pack_sequences(responses.prompt_ids, responses.response_ids, layout.tokenizer.pad_token_id),
            args.repeats,
        ),
    }
    # The trainer's make_experience without its sampling (packing, the experience pass, scoring,
    # shaping), and its ppo_update: PPO steps after one warm-up.
    rates.append(matmul_gflops(1024, 1024, 1024))
    steps = [layout.iteration() for _ in range(args.repeats + 1)][1:]
    phases["experience"] = statistics.median(step["experience"] for step in steps)
    phases["update"] = statistics.median(step["update"] for step in steps)
    decode = (phases["generate"] - phases["prefill (generate 1 token)"]) / max(1, gen.max_new_tokens - 1)

    rates.append(matmul_gflops(1024, 1024, 1024))
    peak = statistics.median(rates)
    hidden = model.config.hidden_size
    at_decode = matmul_gflops(args.batch, hidden, model.config.intermediate_size)
    bound = decode_flops_per_token(model, args.batch) / (peak * 1e9)
    step = phases["generate"] + phases["experience"] + phases["update"]

    print(
        f"threads {torch.get_num_threads()}, {args.batch} responses x {args.new_tokens} new tokens, "
        f"prompts {args.prompt_len} tokens, N = {args.num_layers_unfrozen}, "
        f"{model.config.num_hidden_layers} layers, hidden {hidden}"
    )
    print(f"{'phase':48} {'seconds':>8} {'of step':>8}")
    for name, seconds in phases.items():
        print(f"{name:48} {seconds:8.3f} {seconds / step:8.1%}")
    print(f"{'decode, per token (all rows)':48} {decode:8.4f}")
    print(f"{'  its FLOP bound at the peak matmul rate':48} {bound:8.4f}   ({decode / bound:.1f}x the bound)")
    print(
        f"matmul GFLOP/s: 1024^3 {peak:.1f} (median of {', '.join(f'{r:.1f}' for r in rates)}); decode shape {args.batch}x{hidden}x{model.config.intermediate_size} "
        f"{at_decode:.1f}"
    )
    floors = flop_floors(layout, args, sum(len(row) for row in responses.response_ids))
    measured = {
        "prefill": phases["prefill (generate 1 token)"],
        "decode, per token (all rows)": decode,
        "experience": phases["experience"],
        "update": phases["update"],
    }
    print(f"FLOP floors at the 1024^3 matmul rate ({peak:.1f} GFLOP/s; matmul FLOPs only):")
    print(f"{'phase':32} {'GFLOP':>9} {'floor s':>9} {'measured s':>11} {'x floor':>8}")
    for name, flops in floors.items():
        floor = flops / (peak * 1e9)
        print(f"{name:32} {flops / 1e9:9.2f} {floor:9.4f} {measured[name]:11.4f} {measured[name] / floor:8.1f}")
    print("generation's wall time by operator kind (torch.profiler, self CPU time):")
    for kind, share in operator_shares(layout).items():
        print(f"  {kind:46} {share:8.1%}")


if __name__ == "__main__":
    main()
