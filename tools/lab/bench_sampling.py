"""The samplers of hydrappo/generation/samplers.py side by side, interleaved in one process:
hydrappo's decode loop (DecodeSampler) and transformers' `generate` (GenerateSampler), both as
the trainer runs them (recording the split states), against transformers' continuous batching
(ContinuousBatchingSampler) at several page sizes, on the same prompts. Greedy by default (so
every candidate produces the same tokens and does the same work; the tool checks it); with
--temperature the candidates sample, as training does, and draw different tokens: compare their
tokens/s, and their response lengths.

    python tools/lab/bench_sampling.py                                  # SmolLM2-135M-Instruct, 16 x 32
    python tools/lab/bench_sampling.py --model tiny                     # a 4-layer random Llama
    python tools/lab/bench_sampling.py --page-sizes 256,32,8 --profile  # where the time goes
    python tools/lab/bench_sampling.py --model tiny --default-cache     # transformers' own cache sizing
    python tools/lab/bench_sampling.py --prompts 32 --prompt-len 40-40 --new-tokens 24 -N 4 \
        --temperature 0.7 --page-sizes ""                            # the main job's shape, sampled

Prints per candidate the median seconds of a call, tokens/s and the ratio to generate. With
--profile, one more call of each under torch.profiler: the CPU time of matmuls, attention and
the other operators (masks, cache writes, sampling), and what is left of the wall time outside
operators (Python: generate's loop, continuous batching's scheduler and its thread). Medians of
--repeats rounds after one warm-up call each, the order alternating every round; on a shared
machine compare the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

# OpenMP threads that spin while they wait make a 2-thread run on a busy machine (more runnable
# threads than cores) up to 50x slower in the main thread, and not in continuous batching's own
# thread: the comparison would measure the machine's load. Passive waiting removes that; set
# OMP_WAIT_POLICY yourself to measure otherwise. It must be set before torch loads OpenMP.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

if TYPE_CHECKING:
    from hydrappo.config import GenerationArgs

# torch, transformers and hydrappo are imported where they are used, so that --help answers at once
# (and bench_episodes.py imports load() without them).

MATMUL = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear")
ATTENTION = (
    "aten::scaled_dot_product_attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_attention_math",
    "aten::_scaled_dot_product_efficient_attention",
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="tiny | a model name hydrappo loads")
    parser.add_argument("-N", "--num-layers-unfrozen", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--prompt-len", default="24-40", help="prompt lengths, LOW-HIGH tokens (random ids)")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--page-sizes", default="256,32", help="continuous batching page sizes to compare ('': none)")
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="sample at this temperature, as training does (0: greedy, the same tokens for all)",
    )
    parser.add_argument(
        "--prompts-file",
        default=None,
        help="real prompts (a prompt table, e.g. examples/sentiment/prompts.jsonl, through the "
        "chat template) instead of random ids: the first --prompts of them",
    )
    parser.add_argument(
        "--default-cache",
        action="store_true",
        help="also continuous batching with transformers' own cache sizing (60%% of the free RAM "
        "on a CPU: gigabytes; use with --model tiny on a shared machine)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: leave as is)")
    parser.add_argument("--profile", action="store_true", help="one profiled call of each candidate")
    return parser.parse_args(argv)


def load(args):
    """(hydra, tokenizer): the policy as the trainer builds it (float32, N top layers)."""
    import torch
    import transformers

    from hydrappo.config import ModelConfig
    from hydrappo.model import HydraModel
    from hydrappo.model.hydra import disable_dropout

    if args.model == "tiny":
        from tokenizers import Tokenizer, models
        from transformers import LlamaConfig, PreTrainedTokenizerFast

        torch.manual_seed(0)
        config = LlamaConfig(
            vocab_size=512,
            hidden_size=64,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=128,
            max_position_embeddings=256,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        )
        config._attn_implementation = "sdpa"
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
        vocab = {f"t{i}": i for i in range(512)}
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t3")), eos_token="t2", pad_token="t0"
        )
    else:
        from hydrappo.storage.models import load_model_and_tokenizer

        model, tokenizer = load_model_and_tokenizer(ModelConfig(name_or_path=args.model))
    disable_dropout(model)
    return HydraModel(model, num_layers_unfrozen=args.num_layers_unfrozen), tokenizer


def make_prompts(args, vocab_size: int, tokenizer=None) -> list[list[int]]:
    if args.prompts_file:
        from hydrappo.data import load_prompt_table, tokenize_prompts

        texts, _ = load_prompt_table(args.prompts_file, "prompt", None, None)
        return tokenize_prompts(texts[: args.prompts], tokenizer, 256, True, None).input_ids
    import torch

    low, high = (int(x) for x in args.prompt_len.split("-"))
    generator = torch.Generator().manual_seed(1)
    lengths = torch.randint(low, high + 1, (args.prompts,), generator=generator).tolist()
    return [torch.randint(3, vocab_size, (n,), generator=generator).tolist() for n in lengths]


def candidates(args, hydra, tokenizer, prompts, gen: GenerationArgs) -> dict:
    import torch

    from hydrappo.config import GenerationArgs
    from hydrappo.generation.samplers import (
        ContinuousBatchingSampler,
        DecodeSampler,
        GenerateSampler,
        GraphSampler,
        build_sampler,
    )

    class DefaultCacheSampler(ContinuousBatchingSampler):
        """Continuous batching with transformers' own cache sizing (what `generate_batch` does when given nothing)."""

        def cache_config(self, prompt_ids, max_new_tokens):
            return None

    record = hydra.has_frozen_split  # as the trainer samples (generation.reuse_trunk_pass)
    greedy = args.temperature == 0

    def call(sampler, **options):
        def run():
            torch.manual_seed(0)  # sampled calls draw the same tokens every round
            return sampler.sample(prompts, gen, greedy=greedy, **options)

        return run

    auto = build_sampler(GenerationArgs(sampler="auto"), hydra, tokenizer)  # what a run picks on this device
    found = {
        "generate": call(GenerateSampler(hydra, tokenizer), record_split=record),
        "decode": call(DecodeSampler(hydra, tokenizer), record_split=record),
        f"auto (= {auto.name})": call(auto, record_split=record),
        "graph": call(GraphSampler(hydra, tokenizer), record_split=record),
    }
    for page in (int(p) for p in args.page_sizes.split(",") if p):
        found[f"continuous_batching page {page}"] = call(ContinuousBatchingSampler(hydra, tokenizer, page_size=page))
    if args.default_cache:
        found["continuous_batching, transformers' cache sizing"] = call(DefaultCacheSampler(hydra, tokenizer))
    return found


def interleaved_medians(functions: dict, repeats: int) -> tuple[dict, dict, dict]:
    """(median wall seconds, median CPU seconds of this process, the first call's result) per
    candidate: one warm-up call each, then `repeats` rounds alternating the order. On a shared
    machine the CPU seconds move less than the wall seconds: time spent waiting for a core is not
    counted (with one thread they are the work itself)."""
    results = {name: fn() for name, fn in functions.items()}
    walls: dict[str, list[float]] = {name: [] for name in functions}
    cpus: dict[str, list[float]] = {name: [] for name in functions}
    names = list(functions)
    for round_index in range(repeats):
        for name in names if round_index % 2 == 0 else reversed(names):
            start, cpu = time.perf_counter(), time.process_time()
            functions[name]()
            walls[name].append(time.perf_counter() - start)
            cpus[name].append(time.process_time() - cpu)
    median = statistics.median
    return {n: median(v) for n, v in walls.items()}, {n: median(v) for n, v in cpus.items()}, results


def operator_times(function) -> tuple[dict[str, float], str]:
    """Seconds of one call by operator kind (self CPU time, every thread) and the wall time; the
    largest other operators."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    # Every thread: continuous batching runs the model in a thread of its own while the caller waits.
    config = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU], experimental_config=config) as prof:
        function()
    wall = time.perf_counter() - start
    kinds = {"matmul": 0.0, "attention": 0.0, "other operators": 0.0}
    others = {}
    for event in prof.key_averages():
        seconds = event.self_cpu_time_total / 1e6
        kind = "matmul" if event.key in MATMUL else "attention" if event.key in ATTENTION else "other operators"
        kinds[kind] += seconds
        if kind == "other operators":
            others[event.key] = seconds
    kinds["outside operators"] = max(0.0, wall - sum(kinds.values()))
    kinds["wall"] = wall
    top = sorted(others.items(), key=lambda item: -item[1])[:4]
    return kinds, ", ".join(f"{name} {seconds:.3f}" for name, seconds in top)


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch
    import transformers

    from hydrappo.config import GenerationArgs

    if args.threads:
        torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    hydra, tokenizer = load(args)
    prompts = make_prompts(args, hydra.config.vocab_size, tokenizer)
    gen = GenerationArgs(
        max_new_tokens=args.new_tokens, generation_batch_size=args.prompts, temperature=args.temperature or 1.0
    )
    functions = candidates(args, hydra, tokenizer, prompts, gen)
    medians, cpu_medians, results = interleaved_medians(functions, args.repeats)

    reference = results["generate"].response_ids
    mode = "greedy" if args.temperature == 0 else f"sampled at temperature {args.temperature}"
    source = args.prompts_file or f"random prompts of {args.prompt_len} tokens"
    print(
        f"{args.model}: {len(prompts)} {source} x {args.new_tokens} new tokens ({mode}), "
        f"N = {args.num_layers_unfrozen}, threads {torch.get_num_threads()}, medians of {args.repeats} interleaved rounds"
    )
    print(
        f"{'sampler':40} {'seconds':>8} {'CPU s':>7} {'tokens':>7} {'tokens/s':>9} {'vs generate':>12} "
        f"{'(CPU time)':>11} {'same responses':>15}"
    )
    reference_tokens = sum(len(row) for row in reference)
    for name, seconds in medians.items():
        tokens = sum(len(row) for row in results[name].response_ids)
        same = sum(a == b for a, b in zip(results[name].response_ids, reference))
        speed = tokens / seconds / (reference_tokens / medians["generate"])
        cpu_speed = tokens / cpu_medians[name] / (reference_tokens / cpu_medians["generate"])
        print(
            f"{name:40} {seconds:8.2f} {cpu_medians[name]:7.2f} {tokens:7d} {tokens / seconds:9.1f} {speed:11.2f}x "
            f"{cpu_speed:10.2f}x {same:>9}/{len(reference)}"
        )
    auto = next(name for name in medians if name.startswith("auto"))
    print(
        f"{auto} against the decode loop: {medians['decode'] / medians[auto]:.3f}x the tokens/s (wall), "
        f"{cpu_medians['decode'] / cpu_medians[auto]:.3f}x (CPU time)"
    )
    if args.profile:
        print("one call under torch.profiler, seconds by operator kind (self CPU time, all threads):")
        table = {name: operator_times(fn) for name, fn in functions.items()}
        kinds = list(next(iter(table.values()))[0])
        print(f"{'sampler':48} " + " ".join(f"{kind:>18}" for kind in kinds))
        for name, (row, _) in table.items():
            print(f"{name:48} " + " ".join(f"{row[kind]:18.3f}" for kind in kinds))
        print("largest other operators (seconds):")
        for name, (_, top) in table.items():
            print(f"  {name:46} {top}")


if __name__ == "__main__":
    main()
