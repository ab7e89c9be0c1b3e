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

    chosen, entropy = token_logprobs(hidden, labels, head, transform, temperature=0.7,
                                     with_entropy=with_entropy, chunk_tokens=4)
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
