"""Log-probabilities of chosen tokens and entropy, computed from hidden states in chunks.

PPO needs log p(token) for each generated token, never the full distribution. A
(B, T, vocab) float32 logits tensor is the largest activation of an RLHF step
(8 x 256 x 49k x 4 bytes = 400 MB for a 135M model), so it is never built.

A plain linear lm_head (every model we know) goes through `_FusedLogprobs`: for a chunk of
rows it walks the vocabulary in blocks of columns and keeps a running maximum and sum of
exponentials (the online softmax of Milakov & Gimelshein 2018, as flash attention does),
so that the logits of one block at a time exist. For rows h (n, H), the lm_head W (V, H)
and bias b (V,), the model's logit post-processing t (arch.logits_transform; elementwise)
and the sampling temperature T:

    z = t(h W^T + b) / T                         logits (n, V), one (n, width) block at a time
    L = logsumexp_v z_v,  p = exp(z - L)          the softmax, never stored
    chosen = z_y - L                              log p(y) of the label y (n,)
    entropy = L - sum_v p_v z_v                   (n,)

and their gradients w.r.t. h, with s_v = t'(raw_v) / T the slope of z_v in the raw logit:

    d chosen / dh  = s_y W_y - sum_v p_v s_v W_v
    d entropy / dh = -sum_v p_v (z_v - sum_w p_w z_w) s_v W_v

With a frozen lm_head these are summed over the vocabulary in the SAME pass as the forward
(rescaled with the running maximum), so the update's lm_head costs two matmuls per token
(the logits and their input gradient) and the backward only scales the (n, H) row
gradients it finds saved. With a training lm_head (or bias) the backward needs the
upstream gradient for dL/dW = sum_rows dL/dz^T h, so the forward keeps L (and the entropy's
mean logit) and the backward walks the blocks again. A head that is not a plain
`nn.Linear` falls back to checkpointed chunks of full-vocabulary logits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.amp.autocast_mode import is_autocast_available
from torch.utils.checkpoint import checkpoint

from .arch import raw_logits
from .heads import widened

# Elements of one float32 logits chunk (2**25 = 128 MB): rows per chunk = CHUNK_ELEMENTS // vocab.
CHUNK_ELEMENTS = 2**25
# Vocabulary columns per block on the CPU: a (rows, 2048) float32 block of a few hundred rows
# stays in the 2-4 MB L2 cache while the max, exp and sum pass over it; measured on this
# project's CPU the lm_head then runs at the matmul rate from 64 to 2048 rows per chunk and
# from 512 to 4096 columns (docs/benchmarks.md). On a GPU one block spans the chunk's whole
# vocabulary: fewer, larger kernels, the memory of one chunk as before.
CPU_VOCAB_BLOCK = 2048


def default_chunk_tokens(vocab_size: int) -> int:
    return max(1, CHUNK_ELEMENTS // max(1, vocab_size))


def vocab_block(rows: int, vocab_size: int, device: torch.device) -> int:
    """Columns of the vocabulary per block for a chunk of `rows` rows on `device`."""
    if device.type == "cpu":
        return min(vocab_size, CPU_VOCAB_BLOCK)
    return min(vocab_size, max(1, CHUNK_ELEMENTS // max(1, rows)))


@dataclass(frozen=True)
class _Settings:
    transform: Callable[[torch.Tensor], torch.Tensor] | None  # None: the raw logits
    temperature: float
    with_entropy: bool
    width: int  # vocabulary columns per block
    dtype: torch.dtype  # of the lm_head matmul (autocast's, or the weight's)
    row_grads: bool  # compute d(chosen, entropy)/dh in the forward (frozen lm_head)


def _matmul_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype `lm_head(hidden)` computes in: autocast's lower precision where autocast is on
    (it casts float32 and half inputs of a linear layer, never float64), else the weight's."""
    device = weight.device.type
    if weight.dtype != torch.float64 and is_autocast_available(device) and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return weight.dtype


def _without_autocast(device: torch.device):
    """The fused pass casts for itself (settings.dtype): autocast off inside it, where it exists."""
    if is_autocast_available(device.type):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


def _block(hidden, weight, bias, start, settings: _Settings, slopes: bool):
    """Logits z (n, width) of the vocabulary columns from `start`, in at least float32, and the
    raw logits they were made from when `slopes` asks to pull gradients through t (else None)."""
    stop = min(start + settings.width, weight.shape[0])
    raw = nn.functional.linear(
        hidden, weight[start:stop].to(settings.dtype), None if bias is None else bias[start:stop].to(settings.dtype)
    )
    raw = widened(raw)
    if settings.transform is None:
        # The block is ours (a fresh matmul output or its widened copy): divide in place.
        return (raw.div_(settings.temperature) if settings.temperature != 1.0 else raw), None
    with torch.enable_grad():
        raw.requires_grad_(slopes)
        return settings.transform(raw) / settings.temperature, raw


def _pull(grad_z, z, raw, settings: _Settings):
    """dL/d(raw logits) from dL/dz: times the slope t'(raw) / T (autograd through t)."""
    if raw is None:
        return grad_z / settings.temperature if settings.temperature != 1.0 else grad_z
    return torch.autograd.grad(z, raw, grad_z, retain_graph=True)[0]


def _label_slot(labels, start, width):
    """Which rows have their label in the block of columns start:start+width, and where."""
    index = labels - start
    inside = (index >= 0) & (index < width)
    return inside, index.clamp(0, width - 1).unsqueeze(-1)


def _label_slope(raw_label, settings: _Settings):
    """s_y = t'(raw_y) / T at each row's label (n,), for an elementwise t."""
    if settings.transform is None:
        return None
    with torch.enable_grad():
        leaf = raw_label.detach().requires_grad_(True)
        (slope,) = torch.autograd.grad(settings.transform(leaf).sum() / settings.temperature, leaf)
    return slope


def _forward(hidden, weight, bias, labels, settings: _Settings):
    """One pass over the vocabulary for rows `hidden` (n, H): chosen (n,), entropy (n,) or None,
    logsumexp L (n,), the entropy's mean logit sum_v p_v z_v (n,) or None, and with
    settings.row_grads the row gradients d chosen/dh and d entropy/dh (n, H) (or None).

    Running sums over the blocks seen so far, all relative to their running maximum m (n,):
        S = sum e_v,  U = sum e_v (z_v - m),  P = sum e_v s_v W_v,  Q = sum e_v (z_v - m) s_v W_v
    with e = exp(z - m). A new block's maximum m' rescales them by r = exp(m - m') and shifts
    U and Q by (m' - m) S and (m' - m) P. At the end p = e / S, the mean logit is m + U/S, and
    the entropy log S - U/S; sums of z - m (not z) keep these differences of nearly equal
    numbers small, so a bf16 matmul rounds the entropy's gradient no worse than autograd does."""
    n, width = hidden.shape[0], settings.width
    wide = torch.promote_types(settings.dtype, torch.float32)
    hidden = hidden.to(settings.dtype)
    running_max = hidden.new_full((n,), -float("inf"), dtype=wide)
    exp_sum, picked, raw_picked = (hidden.new_zeros(n, dtype=wide) for _ in range(3))
    shifted_sum = hidden.new_zeros(n, dtype=wide) if settings.with_entropy else None  # U
    pulled = hidden.new_zeros(n, hidden.shape[1], dtype=wide) if settings.row_grads else None  # P
    entropy_grads = settings.row_grads and settings.with_entropy
    pulled_shifted = hidden.new_zeros(n, hidden.shape[1], dtype=wide) if entropy_grads else None  # Q
    for start in range(0, weight.shape[0], width):
        z, raw = _block(hidden, weight, bias, start, settings, slopes=settings.row_grads)
        inside, slot = _label_slot(labels, start, z.shape[1])
        picked = torch.where(inside, z.detach().gather(1, slot).squeeze(1), picked)
        if raw is not None:
            raw_picked = torch.where(inside, raw.detach().gather(1, slot).squeeze(1), raw_picked)
        new_max = torch.maximum(running_max, z.detach().amax(1))
        rescale = torch.exp(running_max - new_max)  # 0 on the first block
        rise = torch.where(exp_sum > 0, new_max - running_max, 0)[:, None]  # m' - m (0, not inf - inf, at first)
        # z - m' and its exp in place when nothing reads z again (no autograd through t).
        shifted = z.sub_(new_max[:, None]) if raw is None else z.detach() - new_max[:, None]
        e = shifted.exp() if settings.with_entropy else shifted.exp_()
        if settings.with_entropy:
            shifted_sum = (shifted_sum - rise[:, 0] * exp_sum) * rescale + (e * shifted).sum(1)
        exp_sum = exp_sum * rescale + e.sum(1)
        if settings.row_grads:
            # Raw logits: the slope 1/T is the same for every column, applied once after the loop.
            def times_slope(grad_z, z=z, raw=raw):
                return (grad_z if raw is None else _pull(grad_z, z, raw, settings)).to(settings.dtype)

            block_weight = weight[start : start + width].to(settings.dtype)
            if pulled_shifted is not None:
                pulled_shifted.sub_(rise * pulled).mul_(rescale[:, None])
                pulled_shifted.add_(times_slope(e * shifted) @ block_weight)
            pulled.mul_(rescale[:, None]).add_(times_slope(e) @ block_weight)
        running_max = new_max
    log_normaliser = running_max + exp_sum.log()
    chosen = picked - log_normaliser
    mean_logit = entropy = None
    if settings.with_entropy:
        mean_shift = shifted_sum / exp_sum  # sum p_v (z_v - m)
        mean_logit, entropy = running_max + mean_shift, exp_sum.log() - mean_shift
    grads = (None, None)
    if settings.row_grads:
        label_rows = weight[labels].to(settings.dtype).to(wide)
        slope = _label_slope(raw_picked, settings)
        if slope is None:  # raw logits: s_v = 1 / T for every v, applied once here
            grad_chosen = (label_rows - pulled / exp_sum[:, None]) / settings.temperature
        else:
            grad_chosen = slope[:, None] * label_rows - pulled / exp_sum[:, None]
        grad_entropy = None
        if pulled_shifted is not None:  # -sum p_v ((z_v - m) - (mean - m)) s_v W_v
            grad_entropy = -(pulled_shifted - mean_shift[:, None] * pulled) / exp_sum[:, None]
            if slope is None:
                grad_entropy = grad_entropy / settings.temperature
        grads = (grad_chosen, grad_entropy)
    return chosen, entropy, log_normaliser, mean_logit, grads


def _live_rows(grad_chosen, grad_entropy):
    """Rows whose outputs the loss reads (a nonzero upstream gradient). Masked rows may hold
    NaN (a fully masked attention row) and NaN * 0 is NaN: they must contribute exactly 0."""
    live = grad_chosen != 0 if grad_chosen is not None else None
    if grad_entropy is not None:
        live = grad_entropy != 0 if live is None else live | (grad_entropy != 0)
    return live


def _backward(hidden, weight, bias, labels, log_normaliser, mean_logit, grad_chosen, grad_entropy, settings, needs):
    """dL/dh (n, H), dL/dW (V, H), dL/db (V,) (each None where `needs` says so), from the
    upstream gradients (n,) of chosen and entropy, walking the vocabulary blocks again:
    dL/dz_v = g_chosen (1[v = y] - p_v) - g_entropy p_v (z_v - sum_w p_w z_w), times t'/T."""
    n, width = hidden.shape[0], settings.width
    wide = torch.promote_types(settings.dtype, torch.float32)
    live = _live_rows(grad_chosen, grad_entropy)
    hidden = torch.where(live[:, None], hidden, 0).to(settings.dtype)
    log_normaliser = torch.where(live, log_normaliser, 0)
    grad_chosen = grad_chosen.to(wide) if grad_chosen is not None else None
    grad_hidden = hidden.new_zeros(n, hidden.shape[1], dtype=wide) if needs[0] else None
    grad_weight = torch.zeros_like(weight, dtype=wide) if needs[1] else None
    grad_bias = torch.zeros_like(bias, dtype=wide) if needs[2] else None
    for start in range(0, weight.shape[0], width):
        z, raw = _block(hidden, weight, bias, start, settings, slopes=True)
        p = torch.exp(z.detach() - log_normaliser[:, None])
        grad_z = torch.zeros_like(p) if grad_chosen is None else p * -grad_chosen[:, None]
        if grad_entropy is not None:
            mean = torch.where(live, mean_logit, 0)
            grad_z -= grad_entropy.to(wide)[:, None] * p * (z.detach() - mean[:, None])
        if grad_chosen is not None:
            inside, slot = _label_slot(labels, start, z.shape[1])
            grad_z.scatter_add_(1, slot, torch.where(inside, grad_chosen, 0).unsqueeze(1))
        grad_raw = _pull(grad_z, z, raw, settings).to(settings.dtype)
        stop = start + grad_raw.shape[1]
        if grad_hidden is not None:
            grad_hidden += grad_raw @ weight[start:stop].to(settings.dtype)
        if grad_weight is not None:
            grad_weight[start:stop] += grad_raw.T @ hidden
        if grad_bias is not None:
            grad_bias[start:stop] += grad_raw.sum(0)
    return grad_hidden, grad_weight, grad_bias


class _FusedLogprobs(torch.autograd.Function):
    """(chosen, entropy) of rows `hidden` (n, H) under the lm_head (weight (V, H), bias (V,) or
    None): see the module's docstring. The entropy output is empty (0,) unless asked for."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, settings: _Settings):
        with _without_autocast(hidden.device):
            chosen, entropy, log_normaliser, mean_logit, grads = _forward(hidden, weight, bias, labels, settings)
        ctx.settings, ctx.hidden_dtype = settings, hidden.dtype
        ctx.set_materialize_grads(False)
        if settings.row_grads:
            ctx.save_for_backward(*(g if g is not None else chosen.new_zeros(0) for g in grads))
        else:
            empty = chosen.new_zeros(0)
            ctx.save_for_backward(
                hidden,
                weight,
                bias if bias is not None else empty,
                labels,
                log_normaliser,
                mean_logit if mean_logit is not None else empty,
            )
            ctx.has_bias = bias is not None
        return chosen, entropy if entropy is not None else chosen.new_zeros(0)

    @staticmethod
    def backward(ctx, grad_chosen, grad_entropy):
        settings = ctx.settings
        if not settings.with_entropy:
            grad_entropy = None
        if grad_chosen is None and grad_entropy is None:
            return None, None, None, None, None
        if settings.row_grads:
            row_chosen, row_entropy = ctx.saved_tensors
            live = _live_rows(grad_chosen, grad_entropy)
            grad = 0
            if grad_chosen is not None:
                grad = grad_chosen.to(row_chosen.dtype)[:, None] * row_chosen
            if grad_entropy is not None:
                grad = grad + grad_entropy.to(row_entropy.dtype)[:, None] * row_entropy
            grad = torch.where(live[:, None], grad, 0)
            return grad.to(ctx.hidden_dtype), None, None, None, None
        hidden, weight, bias, labels, log_normaliser, mean_logit = ctx.saved_tensors
        bias = bias if ctx.has_bias else None
        needs = ctx.needs_input_grad[:3]
        with _without_autocast(hidden.device):
            grads = _backward(
                hidden, weight, bias, labels, log_normaliser, mean_logit, grad_chosen, grad_entropy, settings, needs
            )
        grad_hidden, grad_weight, grad_bias = (
            g.to(t.dtype) if g is not None else None for g, t in zip(grads, (hidden, weight, bias))
        )
        return grad_hidden, grad_weight, grad_bias, None, None


def _chunk_stats(hidden, labels, lm_head, transform, temperature, with_entropy):
    """The fallback for a head that is not a plain nn.Linear: full-vocabulary logits of a chunk."""
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


def is_plain_linear(module: nn.Module) -> bool:
    """Whether `module` computes exactly x W^T + b (not a quantized or adapted subclass)."""
    return isinstance(module, nn.Linear) and type(module).forward is nn.Linear.forward


def token_logprobs(
    hidden: torch.Tensor,
    labels: torch.Tensor,
    lm_head: nn.Module,
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_tokens: int | None = None,
    block_columns: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(transform(lm_head(hidden)) / temperature) gathered at `labels`.

    hidden: (B, T, H) states that predict `labels` (B, T). `transform` is elementwise (None or
    arch.raw_logits: none). Returns log-probs (B, T) in at least float32 and, when asked,
    the entropy (B, T) of the same distributions. `chunk_tokens` rows share a pass over the
    vocabulary, in blocks of `block_columns` columns (default: vocab_block).
    """
    batch, length = labels.shape
    flat_hidden = hidden.reshape(batch * length, hidden.shape[-1])
    flat_labels = labels.reshape(-1)
    if transform is raw_logits:
        transform = None
    vocab = lm_head.weight.shape[0]
    if chunk_tokens is None:
        chunk_tokens = default_chunk_tokens(vocab)
    head_params = list(lm_head.parameters())
    head_trains = any(p.requires_grad for p in head_params)
    needs_graph = torch.is_grad_enabled() and (flat_hidden.requires_grad or head_trains)
    plain = is_plain_linear(lm_head)
    chosen_parts, entropy_parts = [], []
    for start in range(0, flat_labels.numel(), chunk_tokens):
        rows, row_labels = flat_hidden[start : start + chunk_tokens], flat_labels[start : start + chunk_tokens]
        if plain:
            width = block_columns or vocab_block(rows.shape[0], vocab, rows.device)
            settings = _Settings(
                transform,
                float(temperature),
                with_entropy,
                width,
                _matmul_dtype(lm_head.weight),
                row_grads=needs_graph and not head_trains,
            )
            chosen, entropy = _apply(rows, lm_head.weight, lm_head.bias, row_labels, settings, needs_graph)
        elif needs_graph:
            chosen, entropy = checkpoint(
                _chunk_stats,
                rows,
                row_labels,
                lm_head,
                transform or raw_logits,
                temperature,
                with_entropy,
                use_reentrant=False,
            )
        else:
            chosen, entropy = _chunk_stats(
                rows, row_labels, lm_head, transform or raw_logits, temperature, with_entropy
            )
        chosen_parts.append(chosen)
        entropy_parts.append(entropy)
    chosen = torch.cat(chosen_parts).reshape(batch, length) if chosen_parts else hidden.new_zeros(batch, length)
    entropy = None
    if with_entropy:
        entropy = torch.cat(entropy_parts).reshape(batch, length) if entropy_parts else chosen.new_zeros(batch, length)
    return chosen, entropy


def _apply(rows, weight, bias, labels, settings: _Settings, needs_graph: bool):
    if not needs_graph:
        with torch.no_grad(), _without_autocast(rows.device):
            chosen, entropy, *_ = _forward(rows, weight, bias, labels, settings)
        return chosen, entropy
    chosen, entropy = _FusedLogprobs.apply(rows, weight, bias, labels, settings)
    return chosen, entropy if settings.with_entropy else None
