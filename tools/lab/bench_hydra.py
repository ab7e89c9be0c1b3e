"""Benchmark one hydra pass against plain forwards of the unwrapped model.

Measured side by side in one process, interleaved, median of --repeats:
  * forward_hydra (policy log-probs + reference log-probs + values) / one plain forward
  * the two-pass method (full policy forward + full reference-model forward, with the
    same log-prob gathering and value head) / one plain forward
  * parameter bytes of the hydra against the base model

    python tools/lab/bench_hydra.py                       # SmolLM2-135M-shaped Llama, random weights
    python tools/lab/bench_hydra.py --model PATH --num-layers-unfrozen 4
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

# torch, transformers and hydrappo are imported where they are used, so that --help answers at once.


def build_model(name: str):
    import torch
    from transformers import AutoModelForCausalLM

    from hydrappo.planner.presets import PRESETS, preset_config

    if name.lower() in PRESETS:
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(preset_config(name), dtype=torch.float32).eval()
    return AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32).eval()


def param_bytes(module) -> int:
    from hydrappo.planner.counts import unique_bytes

    return unique_bytes(module.parameters())


def gathered_logprobs(logits, ids):
    return logits[:, :-1].float().log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="a preset name or a model directory")
    parser.add_argument("--num-layers-unfrozen", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=64, help="for the response-only log-prob variant")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    args = parser.parse_args(argv)
    import torch

    from hydrappo import HydraModel

    if args.threads:
        torch.set_num_threads(args.threads)

    model = build_model(args.model)
    base_bytes = param_bytes(model)
    reference = copy.deepcopy(model)
    hydra = HydraModel(model, num_layers_unfrozen=args.num_layers_unfrozen)
    layer_bytes = param_bytes(hydra.arch.layers[-1])
    head_bytes = param_bytes(hydra.value_head)
    vocab = model.get_output_embeddings().weight.shape[0]
    torch.manual_seed(1)
    ids = torch.randint(0, vocab, (args.batch, args.seq_len))
    mask = torch.ones_like(ids)

    def plain():
        model(input_ids=ids, attention_mask=mask, use_cache=False)

    def hydra_all_positions():
        hydra.forward_hydra(ids, mask)

    def hydra_response_only():
        hydra.forward_hydra(ids, mask, logprobs_from=args.prompt_len - 1)

    def two_pass():
        policy_out = model(input_ids=ids, attention_mask=mask, use_cache=False, output_hidden_states=True)
        gathered_logprobs(policy_out.logits, ids)
        hydra.value_head(policy_out.hidden_states[-1])
        gathered_logprobs(reference(input_ids=ids, attention_mask=mask, use_cache=False).logits, ids)

    candidates = {
        "plain forward": plain,
        "forward_hydra, log-probs at all positions": hydra_all_positions,
        f"forward_hydra, response log-probs only (prompt {args.prompt_len})": hydra_response_only,
        "two-pass (policy forward + reference forward)": two_pass,
    }
    times = {name: [] for name in candidates}
    with torch.no_grad():
        for fn in candidates.values():
            fn()  # warm-up
        for _ in range(args.repeats):
            for name, fn in candidates.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)

    print(
        f"model {args.model}: {hydra.arch.num_layers} layers, N = {hydra.num_layers_unfrozen}, "
        f"batch {args.batch} x {args.seq_len} tokens, {torch.get_num_threads()} threads, "
        f"median of {args.repeats}"
    )
    plain_time = statistics.median(times["plain forward"])
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"  {name:<58s} {median * 1000:8.1f} ms   ratio to plain {median / plain_time:5.2f}")
    hydra_bytes = param_bytes(hydra)
    expected = base_bytes + hydra.num_layers_unfrozen * layer_bytes + head_bytes
    if hydra.full_model:
        expected = 2 * base_bytes + head_bytes
    print(
        f"parameter bytes: base {base_bytes / 2**20:.1f} MiB, hydra {hydra_bytes / 2**20:.1f} MiB "
        f"(ratio {hydra_bytes / base_bytes:.3f}); base + {hydra.num_layers_unfrozen} layer copies + value head "
        f"= {expected / 2**20:.1f} MiB -> {'exact' if expected == hydra_bytes else 'MISMATCH'}"
    )


if __name__ == "__main__":
    main()
