import pytest
import torch

from hydrappo.model.logprobs import token_logprobs


def reference(hidden, labels, head, temperature, softcap):
    logits = head(hidden)
    logits = torch.tanh(logits / softcap) * softcap
    logp = (logits / temperature).log_softmax(-1)
    return logp.gather(-1, labels[..., None])[..., 0], -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("head_trains", [False, True])
@pytest.mark.parametrize("with_entropy", [False, True])
def test_chunked_logprobs_and_gradients_equal_the_full_softmax(head_trains, with_entropy):
    # In float64: the chunked pass and the reference compute the same values by other formulas and
    # sums (logsumexp-gather vs log_softmax, chunks of 4 rows vs all). Logits are bounded by the
    # softcap, |z| <= 5 / 0.7 ~ 7.2; each value or gradient is a sum of <= 50 terms of that size
    # (times |weights| <= ~3), off by <= 50 * 2**-53 * 7.2 * 3 ~ 1.2e-13 per sum, a few sums deep:
    # ATOL 1e-11 keeps a factor ~10 spare. A chunk or row mixed up is off by ~1e-1.
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False).double()
    head.requires_grad_(head_trains)
    hidden = torch.randn(3, 7, 16, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 50, (3, 7))
    weights = torch.randn(3, 7, dtype=torch.float64)  # a downstream loss that weighs each position differently

    def transform(x):
        return torch.tanh(x / 5.0) * 5.0

    chosen, entropy = token_logprobs(
        hidden, labels, head, transform, temperature=0.7, with_entropy=with_entropy, chunk_tokens=4
    )
    loss = (weights * chosen).sum() + (entropy.sum() if with_entropy else 0)
    grads = torch.autograd.grad(loss, [hidden] + ([head.weight] if head_trains else []))

    expected_chosen, expected_entropy = reference(hidden, labels, head, 0.7, 5.0)
    expected_loss = (weights * expected_chosen).sum() + (expected_entropy.sum() if with_entropy else 0)
    expected_grads = torch.autograd.grad(expected_loss, [hidden] + ([head.weight] if head_trains else []))

    assert chosen.dtype == torch.float64
    torch.testing.assert_close(chosen, expected_chosen, atol=1e-11, rtol=0)
    if with_entropy:
        torch.testing.assert_close(entropy, expected_entropy, atol=1e-11, rtol=0)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, atol=1e-11, rtol=0)


def test_no_graph_without_grad():
    head = torch.nn.Linear(8, 20, bias=False)
    with torch.no_grad():
        chosen, _ = token_logprobs(torch.randn(2, 3, 8), torch.zeros(2, 3, dtype=torch.long), head)
    assert not chosen.requires_grad


def plain(hidden, labels, head, transform, temperature):
    """The whole (B, T, V) computation under plain autograd: what the fused pass must equal."""
    logits = head(hidden)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 logits widen, as the model's do
    logits = (transform(logits) if transform is not None else logits) / temperature
    logp = logits.log_softmax(-1)
    return logp.gather(-1, labels[..., None])[..., 0], -(logp.exp() * logp).sum(-1)


def softcap(x):
    return torch.tanh(x / 5.0) * 5.0


def _case(head_trains, bias, dtype=torch.float64, vocab=50, hidden_size=16, seed=0):
    torch.manual_seed(seed)
    head = torch.nn.Linear(hidden_size, vocab, bias=bias).to(dtype)
    with torch.no_grad():
        head.weight.mul_(3.0)  # logits of a few units, as a trained lm_head gives: softmaxes far from uniform
    head.requires_grad_(head_trains)
    hidden = torch.randn(3, 7, hidden_size, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, vocab, (3, 7))
    return head, hidden, labels


# Fused against plain autograd in float64, over chunks of 4 rows (21 rows: the last chunk short)
# and blocks of 7 vocabulary columns (50 columns: the last block short), so that every running
# rescale and label slot is crossed. The two compute the same values by other sums: |z| <= ~15
# (weights x3, temperature 0.7), each value or gradient sums <= 50 terms of size <= ~15 x |W|
# (<= ~3) with relative rounding 2**-53 ~ 1.1e-16 per operation, a few sums deep (online rescale,
# logsumexp): well under 1e-12 absolute. A row, block or label slot mixed up is off by ~1e-1.
TOLERANCE = dict(atol=1e-11, rtol=0)


@pytest.mark.parametrize("transform", [None, softcap])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("with_entropy", [False, True])
@pytest.mark.parametrize("head_trains,bias", [(False, False), (True, False), (True, True), (False, True)])
def test_fused_values_and_gradients_equal_plain_autograd(transform, temperature, with_entropy, head_trains, bias):
    head, hidden, labels = _case(head_trains, bias)
    weights = torch.randn(3, 7, dtype=torch.float64)
    entropy_weights = torch.randn(3, 7, dtype=torch.float64)
    inputs = [hidden] + ([p for p in head.parameters()] if head_trains else [])

    chosen, entropy = token_logprobs(
        hidden,
        labels,
        head,
        transform,
        temperature=temperature,
        with_entropy=with_entropy,
        chunk_tokens=4,
        block_columns=7,
    )
    loss = (weights * chosen).sum() + ((entropy_weights * entropy).sum() if with_entropy else 0)
    grads = torch.autograd.grad(loss, inputs)

    want_chosen, want_entropy = plain(hidden, labels, head, transform, temperature)
    want_loss = (weights * want_chosen).sum() + ((entropy_weights * want_entropy).sum() if with_entropy else 0)
    want_grads = torch.autograd.grad(want_loss, inputs)

    assert chosen.dtype == torch.float64 and (entropy is not None) == with_entropy
    torch.testing.assert_close(chosen, want_chosen.detach(), **TOLERANCE)
    if with_entropy:
        torch.testing.assert_close(entropy, want_entropy.detach(), **TOLERANCE)
    for got, want in zip(grads, want_grads):
        torch.testing.assert_close(got, want, **TOLERANCE)


@pytest.mark.parametrize("head_trains", [False, True])
def test_entropy_returned_but_not_in_the_loss(head_trains):
    head, hidden, labels = _case(head_trains, bias=False)
    chosen, entropy = token_logprobs(hidden, labels, head, with_entropy=True, chunk_tokens=5, block_columns=16)
    (grad,) = torch.autograd.grad(chosen.sum(), hidden)
    (want,) = torch.autograd.grad(plain(hidden, labels, head, None, 1.0)[0].sum(), hidden)
    torch.testing.assert_close(grad, want, **TOLERANCE)


@pytest.mark.parametrize("head_trains", [False, True])
def test_masked_rows_holding_nan_get_zero_gradient(head_trains):
    # A padded position may hold NaN (a fully masked attention row); the hydra masks its
    # log-prob with torch.where, so its upstream gradient is 0 and 0 * NaN must not leak
    # into the gradient of the other rows or of the lm_head.
    head, hidden, labels = _case(head_trains, bias=False)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[0, 5:] = pad[2, 6] = True
    poisoned = torch.where(pad[..., None], torch.full_like(hidden, float("nan")), hidden)
    chosen, _ = token_logprobs(poisoned, labels, head, temperature=0.7, chunk_tokens=4, block_columns=7)
    inputs = [hidden] + ([head.weight] if head_trains else [])
    grads = torch.autograd.grad(torch.where(pad, 0, chosen).sum(), inputs)
    want_chosen = plain(hidden, labels, head, None, 0.7)[0]
    want_grads = torch.autograd.grad(torch.where(pad, 0, want_chosen).sum(), inputs)
    assert torch.isnan(chosen[pad]).all()
    torch.testing.assert_close(chosen[~pad], want_chosen[~pad].detach(), **TOLERANCE)
    for got, want in zip(grads, want_grads):
        torch.testing.assert_close(got, want, **TOLERANCE)


@pytest.mark.parametrize("head_trains", [False, True])
@pytest.mark.parametrize("mode", ["bf16 model", "float32 under bf16 autocast", "float32"])
def test_low_precision_is_as_accurate_as_plain_autograd(head_trains, mode):
    # The matmuls run in the dtype the lm_head would use (bf16 weights, or autocast's bf16),
    # everything else in float32; plain autograd rounds the same logits and gradients to bf16
    # in other places. Both against float64 from the same (bf16-rounded) inputs: the fused
    # error must stay within 1.5x plain autograd's (measured with bf16: 0.9-1.2x; before the
    # entropy's sums were taken relative to the running maximum, 2.3x for its gradient).
    dtype = torch.bfloat16 if mode == "bf16 model" else torch.float32
    head, hidden, labels = _case(head_trains, bias=False, dtype=dtype, vocab=300, hidden_size=64)
    weights = torch.randn(3, 7)
    rounded = (lambda t: t.to(torch.bfloat16)) if mode != "float32" else (lambda t: t)
    exact_head = torch.nn.Linear(64, 300, bias=False).double().requires_grad_(head_trains)
    exact_head.weight.data.copy_(rounded(head.weight.detach()))
    exact_hidden = rounded(hidden.detach()).double().requires_grad_(True)

    def run(hidden, head, fused, autocast):
        inputs = [hidden] + ([head.weight] if head_trains else [])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            if fused:
                chosen, entropy = token_logprobs(
                    hidden, labels, head, temperature=0.7, with_entropy=True, chunk_tokens=8, block_columns=64
                )
            else:
                chosen, entropy = plain(hidden, labels, head, None, 0.7)
        grads = torch.autograd.grad((weights.to(chosen.dtype) * chosen).sum() + entropy.sum(), inputs)
        return [chosen.detach(), entropy.detach(), *grads]

    autocast = mode.endswith("autocast")
    fused, unfused = run(hidden, head, True, autocast), run(hidden, head, False, autocast)
    exact = run(exact_hidden, exact_head, False, False)
    assert fused[0].dtype == torch.float32
    for got, baseline, want in zip(fused, unfused, exact):
        assert got.dtype == baseline.dtype
        error, baseline_error = ((t.double() - want).abs().max().item() for t in (got, baseline))
        # Plus float32's own rounding, a few 2**-24 of the largest value, where bf16 is not involved.
        assert error <= 1.5 * baseline_error + 2**-20 * want.abs().max().item(), (error, baseline_error)


def test_a_head_that_is_not_a_plain_linear_takes_the_checkpointed_path():
    class Scaled(torch.nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2

    head, hidden, labels = _case(False, bias=False)
    scaled = Scaled(16, 50, bias=False).double().requires_grad_(False)
    scaled.weight.data.copy_(head.weight)
    chosen, _ = token_logprobs(hidden, labels, scaled, chunk_tokens=4)
    (grad,) = torch.autograd.grad(chosen.sum(), hidden)
    want_chosen = plain(hidden, labels, lambda x: scaled(x), None, 1.0)[0]
    (want,) = torch.autograd.grad(want_chosen.sum(), hidden)
    torch.testing.assert_close(chosen, want_chosen.detach(), **TOLERANCE)
    torch.testing.assert_close(grad, want, **TOLERANCE)


def test_no_rows():
    head = torch.nn.Linear(8, 20, bias=False)
    chosen, entropy = token_logprobs(torch.randn(2, 0, 8), torch.zeros(2, 0, dtype=torch.long), head, with_entropy=True)
    assert chosen.shape == entropy.shape == (2, 0)
