"""Where the time of one PPO step goes: prefill, decode per token (against the FLOP bound of
the model on this CPU), the operators inside generation, stop handling, packing, the
experience pass and the update, for hydrappo's real code path (tools/bench_ppo.py's
HydraLayout: rollout.generate_responses, pack_sequences, evaluate_sequences, the cached
update).

    python tools/profile_step.py                                   # the main job's shape
    python tools/profile_step.py --batch 64 --new-tokens 32 -N 2   # a GRPO shape: 8 prompts x 8 samples

Defaults follow examples/sentiment/config.yaml: a SmolLM2-135M-shaped Llama with random
weights, 32 responses of exactly 24 new tokens, N = 4, 40-token prompts, 4 PPO epochs of
mini-batch 4 (the example uses a mini-batch of 8 x gradient accumulation; the work is the
same). Times are medians of --repeats after one warm-up; on a shared machine read them as
indicative and compare phases within one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ppo import HydraLayout, build_base_model, configure, generation_args  # noqa: E402

from hydrappo.rollout import first_stop, generate_responses, pack_sequences  # noqa: E402

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear",
              "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::scaled_dot_product_attention")  # fmt: skip
SAMPLING_OPS = ("aten::softmax", "aten::_softmax", "aten::multinomial", "aten::topk", "aten::sort",
                "aten::cumsum", "aten::div", "aten::argmax", "aten::log_softmax")  # fmt: skip


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--num-layers", type=int, default=None)
    parser.add_argument("-N", "--num-layers-unfrozen", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32, help="responses per step")
    parser.add_argument("--prompt-len", type=int, default=40)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--ppo-epochs", type=int, default=4)
    parser.add_argument("--mini-batch", type=int, default=4)
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


def operator_shares(layout: HydraLayout) -> dict[str, float]:
    """Self CPU time of generation's operators by kind, as shares of the wall time."""
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
    configure(args)
    layout = HydraLayout(build_base_model(args), args)
    model = layout.hydra.model
    gen = generation_args(args)
    one_token = generation_args(argparse.Namespace(**{**vars(args), "new_tokens": 1}))
    responses = layout.rollout()

    phases = {
        "generate": median_seconds(layout.rollout, args.repeats),
        "prefill (generate 1 token)": median_seconds(
            lambda: generate_responses(layout.hydra, layout.tokenizer, layout.prompts, one_token), args.repeats),
        "stop handling (first_stop, no stop strings)": median_seconds(
            lambda: [first_stop(row, {layout.tokenizer.eos_token_id}, [], None) for row in responses.response_ids],
            args.repeats),
        "packing": median_seconds(
            lambda: pack_sequences(responses.prompt_ids, responses.response_ids, layout.tokenizer.pad_token_id),
            args.repeats),
    }  # fmt: skip
    experience = layout.make_experience(responses)
    phases["experience"] = median_seconds(lambda: layout.make_experience(responses), args.repeats)
    phases["update"] = median_seconds(lambda: layout.update(experience), args.repeats)
    decode = (phases["generate"] - phases["prefill (generate 1 token)"]) / max(1, gen.max_new_tokens - 1)

    peak = matmul_gflops(1024, 1024, 1024)
    hidden = model.config.hidden_size
    at_decode = matmul_gflops(args.batch, hidden, model.config.intermediate_size)
    bound = decode_flops_per_token(model, args.batch) / (peak * 1e9)
    step = phases["generate"] + phases["experience"] + phases["update"]

    print(f"threads {torch.get_num_threads()}, {args.batch} responses x {args.new_tokens} new tokens, "
          f"prompts {args.prompt_len} tokens, N = {args.num_layers_unfrozen}, "
          f"{model.config.num_hidden_layers} layers, hidden {hidden}")  # fmt: skip
    print(f"{'phase':48} {'seconds':>8} {'of step':>8}")
    for name, seconds in phases.items():
        print(f"{name:48} {seconds:8.3f} {seconds / step:8.1%}")
    print(f"{'decode, per token (all rows)':48} {decode:8.4f}")
    print(f"{'  its FLOP bound at the peak matmul rate':48} {bound:8.4f}   ({decode / bound:.1f}x the bound)")
    print(f"matmul GFLOP/s: 1024^3 {peak:.1f}; decode shape {args.batch}x{hidden}x{model.config.intermediate_size} "
          f"{at_decode:.1f}")  # fmt: skip
    print("generation's wall time by operator kind (torch.profiler, self CPU time):")
    for kind, share in operator_shares(layout).items():
        print(f"  {kind:46} {share:8.1%}")


if __name__ == "__main__":
    main()
