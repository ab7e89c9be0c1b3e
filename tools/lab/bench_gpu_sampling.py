"""CUDA-graph sampling two ways at the 1.7B shape (bf16, random weights), 32 prompts x exactly 64
sampled tokens: hydrappo's graph sampler (torch.cuda.CUDAGraph over a static cache) against
transformers' generate with its static cache, which generate compiles itself with
torch.compile(mode="reduce-overhead"), and against generate's dynamic cache.
usage: python3 tools/lab/bench_gpu_sampling.py MODEL_DIR   (a folder with a config.json and a tokenizer, as bench_gpu's s1p7)"""

import argparse
import sys
import time

# torch, transformers and hydrappo are imported where they are used, so that --help answers at once.


def timed(label, fn, repeats=3):
    import torch

    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    print(
        f"RESULT {label}: first call {first:.2f} s, then {sorted(times)[len(times) // 2]:.3f} s (median of {repeats})",
        flush=True,
    )


def time_generate(model, tokenizer, prompts) -> None:
    """transformers' generate, dynamic cache and static cache (compiled by generate itself)."""
    import torch

    tokenizer.padding_side = "left"  # a left-padded batch for generate
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    batch = tokenizer.pad({"input_ids": prompts}, return_tensors="pt").to("cuda")
    kwargs = dict(
        max_new_tokens=64,
        min_new_tokens=64,
        do_sample=True,
        temperature=0.7,
        top_k=0,
        top_p=1.0,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.no_grad():
        timed("transformers generate, dynamic cache", lambda: model.generate(**batch, **kwargs))
        timed(
            "transformers generate, static cache + torch.compile reduce-overhead",
            lambda: model.generate(**batch, **kwargs, cache_implementation="static"),
        )


def time_hydrappo(model, tokenizer, prompts) -> None:
    """hydrappo's graph sampler and its eager decode loop, both recording split states."""
    import torch

    from hydrappo import HydraModel
    from hydrappo.config import GenerationArgs
    from hydrappo.generation.graph_decode import GraphDecoding
    from hydrappo.generation.responses import generate_responses

    hydra = HydraModel(model, 2)
    args = GenerationArgs(max_new_tokens=64, min_new_tokens=64, generation_batch_size=32, temperature=0.7)
    graph = GraphDecoding(hydra)
    with torch.no_grad():
        timed(
            "hydrappo graph sampler (CUDAGraph, records split states)",
            lambda: generate_responses(hydra, tokenizer, prompts, args, record_split=True, loop=graph.chunk),
        )
        timed(
            "hydrappo decode loop (eager)",
            lambda: generate_responses(hydra, tokenizer, prompts, args, record_split=True, loop="decode"),
        )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\nusage:")[0])
    parser.add_argument("model_dir", help="a folder with a config.json and a tokenizer (as bench_gpu's s1p7)")
    args = parser.parse_args(argv)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).cuda().eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(20, 40, (32,))
    prompts = [torch.randint(10, 1000, (int(length),), generator=generator).tolist() for length in lengths]
    time_generate(model, tokenizer, prompts)
    time_hydrappo(model, tokenizer, prompts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
