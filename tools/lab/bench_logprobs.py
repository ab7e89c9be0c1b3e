"""The update's lm_head log-prob path (and its AdamW) before and after, side by side.

    before  the code of commit 3916af5 (copied below as `previous_token_logprobs`): chunks of
            rows with full-vocabulary logits; with a frozen lm_head and no entropy, each
            chunk's gradient taken by autograd inside the forward (logsumexp, gather and their
            backward: about a dozen passes over a rows x vocab float32 tensor), else
            activation checkpointing.
    after   hydrappo.model.logprobs.token_logprobs: the log-prob and its input gradient in one
            pass over the vocabulary in blocks of columns (model/logprobs.py).

Measured in ONE process, candidates interleaved, medians of --repeats after a warm-up:

  1. the lm_head alone: the response rows of one mini-batch (--mini-batch x --new-tokens) of a
     SmolLM2-135M-shaped lm_head (vocab 49152, hidden 576, frozen), log-probs at --temperature,
     forward + backward to the hidden state (the update) and forward under no_grad (the
     experience pass); against the FLOP floor (2 matmuls, or 1 without gradient) at the
     1024^3 matmul rate measured in the same run;
  2. the update phase at the main job's shape (tools/lab/bench_ppo.py's HydraLayout: 32 responses x
     (40 + 24) tokens, N = 4, 4 epochs of mini-batch 8, log-probs at --temperature), with the
     hydra's token_logprobs swapped, with torch's AdamW loop of elementwise operations (the
     optimizer before) and with its fused kernel (the trainer's optimizer now); against its
     FLOP floor (tools/lab/profile_step.py's table). --profile adds
     torch.profiler's top operators of one update of each.

    python tools/lab/bench_logprobs.py --threads 1
    python tools/lab/bench_logprobs.py --threads 1 --skip-update    # the lm_head alone (seconds)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from profile_step import MATMUL_OPS, flop_floors, step_shape_arguments  # noqa: E402 (imports no torch)


# ---------------------------------------------------------------------------- options
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    step_shape_arguments(parser)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    parser.add_argument("--skip-update", action="store_true", help="only the lm_head alone")
    parser.add_argument("--profile", action="store_true", help="torch.profiler's top operators of one update each")
    return parser.parse_args(argv)


if __name__ == "__main__":
    parse_args()  # --help and a wrong option answer here, before torch and hydrappo load below

import torch  # noqa: E402
from bench_ppo import HydraLayout, build_base_model, configure  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

import hydrappo.model.hydra as hydra_module  # noqa: E402
from hydrappo.model.heads import widened  # noqa: E402
from hydrappo.model.logprobs import token_logprobs  # noqa: E402


# ---------------------------------------------------------------------------- the code before (3916af5)
def _chunk_stats(hidden, labels, lm_head, transform, temperature, with_entropy):
    logits = widened(transform(lm_head(hidden)))
    if temperature != 1.0:
        logits = logits / temperature
    log_normaliser = torch.logsumexp(logits, dim=-1)
    chosen = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - log_normaliser
    if not with_entropy:
        return chosen, None
    entropy = log_normaliser - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return chosen, entropy


class _PrecomputedGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, value, row_grad):
        ctx.save_for_backward(row_grad)
        return value

    @staticmethod
    def backward(ctx, grad_value):
        (row_grad,) = ctx.saved_tensors
        return grad_value.unsqueeze(-1).to(row_grad.dtype) * row_grad, None, None


def _chunk_logprobs_with_local_grad(hidden, labels, lm_head, transform, temperature):
    detached = hidden.detach().requires_grad_(True)
    with torch.enable_grad():
        chosen, _ = _chunk_stats(detached, labels, lm_head, transform, temperature, False)
        (row_grad,) = torch.autograd.grad(chosen.sum(), detached)
    return _PrecomputedGrad.apply(hidden, chosen.detach(), row_grad), None


def previous_token_logprobs(
    hidden, labels, lm_head, transform=None, *, temperature=1.0, with_entropy=False, chunk_tokens=None
):
    """token_logprobs as of commit 3916af5 (its default chunk: 2**25 logits)."""
    transform = transform or (lambda x: x)
    batch, length = labels.shape
    flat_hidden = hidden.reshape(batch * length, hidden.shape[-1])
    flat_labels = labels.reshape(-1)
    if chunk_tokens is None:
        chunk_tokens = max(1, 2**25 // lm_head.weight.shape[0])
    head_trains = any(p.requires_grad for p in lm_head.parameters())
    needs_graph = torch.is_grad_enabled() and (flat_hidden.requires_grad or head_trains)
    local_grad = needs_graph and not head_trains and not with_entropy
    chosen_parts, entropy_parts = [], []
    for start in range(0, flat_labels.numel(), chunk_tokens):
        args = (flat_hidden[start : start + chunk_tokens], flat_labels[start : start + chunk_tokens])
        if local_grad:
            chosen, entropy = _chunk_logprobs_with_local_grad(*args, lm_head, transform, temperature)
        elif needs_graph:
            chosen, entropy = checkpoint(
                _chunk_stats, *args, lm_head, transform, temperature, with_entropy, use_reentrant=False
            )
        else:
            chosen, entropy = _chunk_stats(*args, lm_head, transform, temperature, with_entropy)
        chosen_parts.append(chosen)
        entropy_parts.append(entropy)
    chosen = torch.cat(chosen_parts).reshape(batch, length)
    entropy = torch.cat(entropy_parts).reshape(batch, length) if with_entropy else None
    return chosen, entropy


CANDIDATES = {"before": previous_token_logprobs, "after": token_logprobs}


# ---------------------------------------------------------------------------- measuring
RATE = "matmul 1024^3"  # timed in every round, beside the candidates: the load moves it by 2x within minutes


def interleaved(functions: dict, repeats: int) -> dict[str, float]:
    """Median seconds of each function, run in turn `repeats` times after one warm-up each, and
    under RATE the median matmul rate (GFLOP/s) of 1024^3 matmuls timed in the same rounds."""
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    functions = {**functions, RATE: lambda: [a @ b for _ in range(10)]}
    for function in functions.values():
        function()
    times = {name: [] for name in functions}
    for _ in range(repeats):
        for name, function in functions.items():
            start = time.perf_counter()
            function()
            times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(values) for name, values in times.items()}
    medians[RATE] = 10 * 2 * 1024**3 / medians[RATE] / 1e9
    return medians


def lm_head_alone(model, args) -> None:
    vocab, hidden_size = model.get_output_embeddings().weight.shape
    head = torch.nn.Linear(hidden_size, vocab, bias=False)  # the model's, frozen as the hydra holds it
    head.weight = torch.nn.Parameter(model.get_output_embeddings().weight.detach(), requires_grad=False)
    rows = args.mini_batch * args.new_tokens
    generator = torch.Generator().manual_seed(3)
    hidden = torch.randn(args.mini_batch, args.new_tokens, hidden_size, generator=generator)
    labels = torch.randint(0, vocab, (args.mini_batch, args.new_tokens), generator=generator)
    weights = torch.randn(args.mini_batch, args.new_tokens, generator=generator)

    def update(function):
        leaf = hidden.clone().requires_grad_(True)
        chosen, _ = function(leaf, labels, head, temperature=args.temperature)
        (weights * chosen).sum().backward()

    def experience(function):
        with torch.no_grad():
            function(hidden, labels, head, temperature=args.temperature)

    print(
        f"lm_head alone: {rows} rows x vocab {vocab} x hidden {hidden_size}, temperature {args.temperature}, "
        "frozen lm_head; floor: its matmul FLOPs at the 1024^3 matmul rate of the same rounds"
    )
    print(
        f"{'pass':28} {'before s':>9} {'after s':>9} {'after/before':>13} {'before x floor':>15} "
        f"{'after x floor':>14} {'GFLOP/s':>8}"
    )
    for name, work, matmuls in (("forward + input gradient", update, 2), ("forward, no_grad", experience, 1)):
        seconds = interleaved({k: (lambda f=f, work=work: work(f)) for k, f in CANDIDATES.items()}, args.repeats)
        floor = matmuls * 2 * rows * vocab * hidden_size / (seconds[RATE] * 1e9)
        before, after = seconds["before"], seconds["after"]
        print(
            f"{name:28} {before:9.4f} {after:9.4f} {after / before:13.2f} {before / floor:15.2f} "
            f"{after / floor:14.2f} {seconds[RATE]:8.1f}"
        )


def update_phase(model, args) -> None:
    layout = HydraLayout(model, args)
    trainer, responses = layout.trainer, layout.rollout()
    plan = trainer.ppo_step.step_plan()
    experience, _, _ = trainer.ppo_step.make_experience(plan)  # the trainer's own step, as bench_ppo times it
    # The trainer's optimizer (torch's fused AdamW kernel where it runs), and torch's AdamW as a
    # loop of elementwise operations per tensor, the optimizer before (docs/benchmarks.md).
    hyper = layout.optimizer.defaults
    adamw_loop = torch.optim.AdamW(
        layout.params, lr=hyper["lr"], betas=hyper["betas"], eps=hyper["eps"], weight_decay=hyper["weight_decay"]
    )  # torch's default
    candidates = {  # name: (token_logprobs, optimizer)
        "before": (previous_token_logprobs, adamw_loop),
        "fused log-probs": (token_logprobs, adamw_loop),
        "fused log-probs + fused AdamW (the trainer's)": (token_logprobs, layout.optimizer),
    }

    def update(function, optimizer):
        hydra_module.token_logprobs, trainer.harness.optimizer = function, optimizer
        try:
            trainer.ppo_step.ppo_update(experience, plan)
        finally:
            hydra_module.token_logprobs, trainer.harness.optimizer = token_logprobs, layout.optimizer

    seconds = interleaved({k: (lambda c=c: update(*c)) for k, c in candidates.items()}, args.repeats)
    flops = flop_floors(layout, args, sum(len(row) for row in responses.response_ids))["update"]
    floor = flops / (seconds[RATE] * 1e9)
    print(
        f"update phase: {args.batch} responses x ({args.prompt_len} + {args.new_tokens}) tokens, "
        f"N = {args.num_layers_unfrozen}, {args.ppo_epochs} epochs of mini-batch {args.mini_batch}, "
        f"temperature {args.temperature}; {flops / 1e9:.1f} GFLOP, at the 1024^3 matmul rate of the same rounds "
        f"({seconds[RATE]:.1f} GFLOP/s) a floor of {floor:.2f} s"
    )
    print(f"{'update':28} {'seconds':>9} {'/ before':>9} {'x floor':>9}")
    for name in candidates:
        print(f"{name:28} {seconds[name]:9.3f} {seconds[name] / seconds['before']:9.2f} {seconds[name] / floor:9.2f}")
    if args.profile:
        for name, candidate in candidates.items():
            start = time.perf_counter()
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                update(*candidate)
            wall = time.perf_counter() - start
            events = prof.key_averages()
            matmul = sum(e.self_cpu_time_total for e in events if e.key in MATMUL_OPS) / 1e6
            print(
                f"--- {name}: one profiled update {wall:.2f} s; matmul operators {matmul:.2f} s "
                f"({matmul / wall:.0%}, {flops / matmul / 1e9:.1f} GFLOP/s: the update is {wall / matmul:.2f}x "
                "its own matmuls); top operators by self CPU time:"
            )
            print(events.table(sort_by="self_cpu_time_total", row_limit=15))


def main(argv=None) -> None:
    args = parse_args(argv)
    configure(args)
    model = build_base_model(args)
    print(f"threads {torch.get_num_threads()}")
    lm_head_alone(model, args)
    if not args.skip_update:
        update_phase(model, args)


if __name__ == "__main__":
    main()
