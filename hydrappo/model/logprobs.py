"""Log-probabilities of chosen tokens and entropy, computed from hidden states in chunks.

PPO needs log p(token) for each generated token, never the full distribution. A
(B, T, vocab) float32 logits tensor is the largest activation of an RLHF step
(8 x 256 x 49k x 4 bytes = 400 MB for a 135M model), so it is never built: the
lm_head runs over a few hundred positions at a time, and under autograd each chunk
is checkpointed so that backward recomputes its logits instead of keeping them.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .heads import widened

# Elements of one float32 logits chunk (2**25 = 128 MB).
CHUNK_ELEMENTS = 2**25


def default_chunk_tokens(vocab_size: int) -> int:
    return max(1, CHUNK_ELEMENTS // max(1, vocab_size))


def _chunk_stats(hidden, labels, lm_head, transform, temperature, with_entropy):
    logits = widened(transform(lm_head(hidden)))
    if temperature != 1.0:
        logits = logits / temperature
    log_normaliser = torch.logsumexp(logits, dim=-1)
    chosen = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - log_normaliser
    if not with_entropy:
        return chosen, None
    # H = logsumexp(z) - sum softmax(z) * z, without materialising log_softmax.
    entropy = log_normaliser - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return chosen, entropy


class _PrecomputedGrad(torch.autograd.Function):
    """Attaches `value` (B,) to `hidden` (B, H) with a known per-row gradient."""

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
        # Rows are independent, so the gradient of the sum is each row's own gradient.
        (row_grad,) = torch.autograd.grad(chosen.sum(), detached)
    return _PrecomputedGrad.apply(hidden, chosen.detach(), row_grad), None


def token_logprobs(
    hidden: torch.Tensor,
    labels: torch.Tensor,
    lm_head: nn.Module,
    transform: Callable[[torch.Tensor], torch.Tensor] = lambda x: x,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(transform(lm_head(hidden)) / temperature) gathered at `labels`.

    hidden: (B, T, H) states that predict `labels` (B, T). Returns float32 log-probs
    (B, T) and, when asked, the entropy (B, T) of the same distributions.
    """
    batch, length = labels.shape
    flat_hidden = hidden.reshape(batch * length, hidden.shape[-1])
    flat_labels = labels.reshape(-1)
    if chunk_tokens is None:
        chunk_tokens = default_chunk_tokens(lm_head.weight.shape[0])
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
    chosen = torch.cat(chosen_parts).reshape(batch, length) if chosen_parts else hidden.new_zeros(batch, length)
    entropy = None
    if with_entropy:
        entropy = torch.cat(entropy_parts).reshape(batch, length) if entropy_parts else chosen.new_zeros(batch, length)
    return chosen, entropy
