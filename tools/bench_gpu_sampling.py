"""CUDA-graph sampling two ways at the 1.7B shape (bf16, random weights), 32 prompts x exactly 64
sampled tokens: hydrappo's graph sampler (torch.cuda.CUDAGraph over a static cache) against
transformers' generate with its static cache, which generate compiles itself with
torch.compile(mode="reduce-overhead"), and against generate's dynamic cache.
usage: python3 tools/bench_gpu_sampling.py MODEL_DIR   (a folder with a config.json and a tokenizer, as bench_gpu's s1p7)"""

import sys
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from hydrappo import HydraModel
from hydrappo.config import GenerationArgs
from hydrappo.generation.graph_decode import GraphDecoding
from hydrappo.generation.responses import generate_responses

model_dir = sys.argv[1]
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir), dtype=torch.bfloat16).cuda().eval()
tokenizer = AutoTokenizer.from_pretrained(model_dir)
g = torch.Generator().manual_seed(0)
prompts = [torch.randint(10, 1000, (int(n),), generator=g).tolist() for n in torch.randint(20, 40, (32,))]


def timed(label, fn, repeats=3):
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


# left-padded batch for generate
tokenizer.padding_side = "left"
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
