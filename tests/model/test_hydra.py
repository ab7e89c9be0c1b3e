import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hydrappo import HydraModel
from hydrappo.model.arch import UnsupportedModelError
from hydrappo.model.split import last_token_index

from tiny import FAMILIES, FLOAT64_ATOL, LAYERS, VOCAB, first_family_quick, left_padded_batch, tiny64, tiny_model

# Longer than the sliding windows of the tiny Mistral/Qwen2 configs (8), so that
# per-layer sliding-window masks are exercised. The tests that compare the hydra's numbers with
# the model's own (padded batch vs single row) or two of its passes (the cached split vs the
# whole pass) run the tiny models in float64, within FLOAT64_ATOL (tests/helpers/tiny.py says why).
ROWS = [list(range(5, 19)), [20, 21, 22, 23, 24], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39]]


def unpadded_logprobs(model, row):
    logits = model(torch.tensor([row])).logits[0, :-1]
    return logits.log_softmax(-1).gather(-1, torch.tensor(row[1:])[:, None])[:, 0]


def row_values(tensor, row_index, length):
    """The last `length` entries of a left-padded row."""
    return tensor[row_index, tensor.shape[1] - length :]


def ppo_like_step(hydra, ids, mask):
    optimizer = torch.optim.SGD(hydra.trainable_parameters(), lr=0.5)
    out = hydra.forward_hydra(ids, mask)
    advantages = torch.linspace(-1, 1, out.logprobs.shape[1]).expand_as(out.logprobs)
    loss = -(advantages * out.logprobs).mean() + 0.1 * (out.values - 1.0).pow(2).mean()
    loss.backward()
    return optimizer, out


@pytest.mark.parametrize("family", first_family_quick())
def test_reference_equals_policy_equals_unwrapped_model(family):
    model = tiny64(family)
    hydra = HydraModel(model, num_layers_unfrozen=2)
    ids, mask = left_padded_batch(ROWS)
    out = hydra.forward_hydra(ids, mask, return_entropy=True)

    assert out.logprobs.shape == (3, ids.shape[1] - 1) and out.values.shape == ids.shape
    assert torch.equal(out.ref_logprobs, out.logprobs)
    for i, row in enumerate(ROWS):
        expected = unpadded_logprobs(model, row)
        torch.testing.assert_close(row_values(out.logprobs, i, len(row) - 1), expected, atol=FLOAT64_ATOL, rtol=0)
        torch.testing.assert_close(row_values(out.ref_logprobs, i, len(row) - 1), expected, atol=FLOAT64_ATOL, rtol=0)
        # Padding positions hold exactly 0.
        pad = ids.shape[1] - len(row)
        assert torch.all(out.logprobs[i, : max(pad - 1, 0)] == 0)
        assert torch.all(out.values[i, :pad] == 0)


@pytest.mark.parametrize("family", first_family_quick())
def test_forward_top_from_cached_split_equals_forward_hydra(family):
    hydra = HydraModel(tiny64(family), num_layers_unfrozen=2)
    ids, mask = left_padded_batch(ROWS)
    out = hydra.forward_hydra(ids, mask, return_entropy=True)
    assert out.split_hidden is not None and not out.split_hidden.requires_grad
    top = hydra.forward_top(out.split_hidden, ids, mask, return_entropy=True)
    torch.testing.assert_close(top.logprobs, out.logprobs, atol=FLOAT64_ATOL, rtol=0)
    torch.testing.assert_close(top.values, out.values, atol=FLOAT64_ATOL, rtol=0)
    torch.testing.assert_close(top.entropy, out.entropy, atol=FLOAT64_ATOL, rtol=0)
    # A minibatch slice of the cache gives that slice's numbers.
    part = hydra.forward_top(out.split_hidden[1:], ids[1:], mask[1:])
    torch.testing.assert_close(part.logprobs, out.logprobs[1:], atol=FLOAT64_ATOL, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_training_step_moves_policy_only_through_top_layers_and_heads(family):
    model = tiny64(family)
    hydra = HydraModel(model, num_layers_unfrozen=2)
    ids, mask = left_padded_batch(ROWS)
    before = hydra.forward_hydra(ids, mask)
    ref_params_before = [p.clone() for p in hydra.ref_layers.parameters()]

    optimizer, _ = ppo_like_step(hydra, ids, mask)
    top_names = {f"model.{name}" for name, _ in model.named_parameters() if _is_top_layer(hydra, name)}
    for name, param in hydra.named_parameters():
        trains = name in top_names or name.startswith("value_head.")
        assert param.requires_grad == trains, name
        assert (param.grad is not None) == trains, name
    optimizer.step()

    after = hydra.forward_hydra(ids, mask)
    torch.testing.assert_close(after.ref_logprobs, before.ref_logprobs, atol=0, rtol=0)
    assert all(torch.equal(a, b) for a, b in zip(ref_params_before, hydra.ref_layers.parameters()))
    assert (after.logprobs - before.logprobs).abs().max() > 1e-3
    assert torch.equal(after.split_hidden, before.split_hidden)
    # The reference still equals the untouched original model.
    original = tiny64(family)
    for i, row in enumerate(ROWS):
        expected = unpadded_logprobs(original, row)
        torch.testing.assert_close(row_values(after.ref_logprobs, i, len(row) - 1), expected, atol=FLOAT64_ATOL, rtol=0)


def _is_top_layer(hydra, model_param_name):
    layers = hydra.arch.layers
    top_ids = {id(p) for layer in layers[hydra.split_index :] for p in layer.parameters()}
    return id(dict(hydra.model.named_parameters())[model_param_name]) in top_ids


def test_zero_unfrozen_layers_trains_only_the_heads():
    hydra = HydraModel(tiny64("llama"), num_layers_unfrozen=0)
    assert [n for n, p in hydra.named_parameters() if p.requires_grad] == [
        n for n, _ in hydra.named_parameters() if n.startswith("value_head.")
    ]
    assert len(hydra.ref_layers) == 0
    ids, mask = left_padded_batch(ROWS)
    before = hydra.forward_hydra(ids, mask)
    assert torch.equal(before.ref_logprobs, before.logprobs)
    optimizer, _ = ppo_like_step(hydra, ids, mask)
    optimizer.step()
    after = hydra.forward_hydra(ids, mask)
    assert torch.equal(after.logprobs, before.logprobs)
    assert (after.values - before.values).abs().max() > 1e-4
    top = hydra.forward_top(after.split_hidden, ids, mask)
    torch.testing.assert_close(top.logprobs, after.logprobs, atol=FLOAT64_ATOL, rtol=0)
    torch.testing.assert_close(top.values, after.values, atol=FLOAT64_ATOL, rtol=0)


@pytest.mark.parametrize("num_layers_unfrozen", [-1, LAYERS, LAYERS + 3])
def test_whole_model_training_keeps_a_complete_frozen_reference(num_layers_unfrozen):
    model = tiny64("llama")
    hydra = HydraModel(model, num_layers_unfrozen=num_layers_unfrozen)
    assert hydra.full_model and hydra.num_layers_unfrozen == LAYERS
    assert all(p.requires_grad for p in model.parameters())
    assert not any(p.requires_grad for p in hydra.reference_model.parameters())
    ids, mask = left_padded_batch(ROWS)
    before = hydra.forward_hydra(ids, mask)
    assert before.split_hidden is None
    optimizer, _ = ppo_like_step(hydra, ids, mask)
    assert model.get_input_embeddings().weight.grad is not None
    optimizer.step()
    after = hydra.forward_hydra(ids, mask)
    torch.testing.assert_close(after.ref_logprobs, before.ref_logprobs, atol=0, rtol=0)
    assert (after.logprobs - before.logprobs).abs().max() > 1e-3
    original = tiny64("llama")
    for i, row in enumerate(ROWS):
        expected = unpadded_logprobs(original, row)
        torch.testing.assert_close(row_values(after.ref_logprobs, i, len(row) - 1), expected, atol=FLOAT64_ATOL, rtol=0)
    top = hydra.forward_top(None, ids, mask)
    torch.testing.assert_close(top.logprobs, after.logprobs, atol=FLOAT64_ATOL, rtol=0)


def test_trainable_tied_lm_head_is_untied_and_embeddings_stay_frozen():
    model = tiny_model("llama")
    assert model.lm_head.weight is model.get_input_embeddings().weight
    hydra = HydraModel(model, num_layers_unfrozen=1, train_lm_head=True)
    embeddings = model.get_input_embeddings().weight
    assert model.lm_head.weight is not embeddings and not embeddings.requires_grad
    assert model.lm_head.weight.requires_grad and hydra.ref_lm_head is not None
    embeddings_before = embeddings.clone()
    ids, mask = left_padded_batch(ROWS)
    before = hydra.forward_hydra(ids, mask)
    assert torch.equal(before.ref_logprobs, before.logprobs)
    optimizer, _ = ppo_like_step(hydra, ids, mask)
    assert embeddings.grad is None and model.lm_head.weight.grad is not None
    optimizer.step()
    assert torch.equal(embeddings, embeddings_before)
    after = hydra.forward_hydra(ids, mask)
    torch.testing.assert_close(after.ref_logprobs, before.ref_logprobs, atol=0, rtol=0)
    assert not model.config.tie_word_embeddings


def test_trainable_final_norm_gets_a_frozen_reference_copy():
    hydra = HydraModel(tiny64("qwen2"), num_layers_unfrozen=1, train_final_norm=True)
    ids, mask = left_padded_batch(ROWS)
    before = hydra.forward_hydra(ids, mask)
    optimizer, _ = ppo_like_step(hydra, ids, mask)
    assert hydra.arch.final_norm.weight.grad is not None
    optimizer.step()
    after = hydra.forward_hydra(ids, mask)
    torch.testing.assert_close(after.ref_logprobs, before.ref_logprobs, atol=0, rtol=0)
    top = hydra.forward_top(after.split_hidden, ids, mask)
    torch.testing.assert_close(top.logprobs, after.logprobs, atol=FLOAT64_ATOL, rtol=0)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_reward_branch_scores_the_last_real_token(family):
    model = tiny64(family)
    hydra = HydraModel(model, num_layers_unfrozen=2)
    torch.manual_seed(3)
    branch = hydra.new_reward_branch()
    hydra.attach_reward_branch(branch)
    # Left padding and right padding (a response that ended early) in one batch.
    ids, mask = left_padded_batch(ROWS)
    mask[0, -3:] = 0
    ids[0, -3:] = 0
    out = hydra.forward_hydra(ids, mask)
    assert out.scores.shape == (3,)
    for i in range(3):
        real = ids[i][mask[i].bool()]
        final_hidden = model(real[None], output_hidden_states=True).hidden_states[-1][0, -1]
        torch.testing.assert_close(out.scores[i], branch.head(final_hidden), atol=FLOAT64_ATOL, rtol=0)
    assert last_token_index(mask).tolist() == [ids.shape[1] - 4, ids.shape[1] - 1, ids.shape[1] - 1]


def test_entropy_and_logits_match_full_softmax():
    model = tiny64("mistral")
    hydra = HydraModel(model, num_layers_unfrozen=2, logprob_chunk_tokens=5)
    row = ROWS[0]
    out = hydra.forward_hydra(torch.tensor([row]), return_entropy=True, return_logits=True, temperature=0.7)
    logits = model(torch.tensor([row])).logits
    torch.testing.assert_close(out.logits, logits, atol=FLOAT64_ATOL, rtol=0)
    torch.testing.assert_close(out.ref_logits, logits, atol=FLOAT64_ATOL, rtol=0)
    logp = (logits[0, :-1] / 0.7).log_softmax(-1)
    torch.testing.assert_close(
        out.logprobs[0], logp.gather(-1, torch.tensor(row[1:])[:, None])[:, 0], atol=FLOAT64_ATOL, rtol=0
    )
    torch.testing.assert_close(out.entropy[0], -(logp.exp() * logp).sum(-1), atol=FLOAT64_ATOL, rtol=0)


class _LargestLogitsTensor(TorchDispatchMode):
    """Records the largest tensor with a vocabulary-sized last dimension that any op creates."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(tensor, torch.Tensor) and tensor.dim() and tensor.shape[-1] == VOCAB:
                self.largest = max(self.largest, tensor.numel())
        return out


@pytest.mark.parametrize("with_entropy", [True, False])  # checkpointed chunks / precomputed row gradients
def test_full_logits_tensor_never_exists_in_forward_or_backward(with_entropy):
    hydra = HydraModel(tiny_model("llama"), num_layers_unfrozen=2, logprob_chunk_tokens=4)
    ids, mask = left_padded_batch(ROWS)
    full = ids.shape[0] * (ids.shape[1] - 1) * VOCAB
    with _LargestLogitsTensor() as mode:
        out = hydra.forward_hydra(ids, mask, return_entropy=with_entropy)
        (out.logprobs.sum() + (out.entropy.sum() if with_entropy else 0)).backward()
    # Weights of shape (VOCAB, H) and chunks of 4 positions; nothing near B*T*V.
    assert 0 < mode.largest <= max(4 * VOCAB, hydra.model.lm_head.weight.numel())
    assert mode.largest < full


def test_dropout_is_off_even_in_train_mode():
    model = tiny_model("gpt2", resid_pdrop=0.5, embd_pdrop=0.5, attn_pdrop=0.5)
    hydra = HydraModel(model, num_layers_unfrozen=2).train()
    ids, mask = left_padded_batch(ROWS)
    first = hydra.forward_hydra(ids, mask).logprobs
    second = hydra.forward_hydra(ids, mask).logprobs
    assert torch.equal(first, second)


@pytest.mark.parametrize("family", ["gemma2", "cohere"])
def test_logit_postprocessing_of_the_model_is_honoured(family):
    from transformers import AutoModelForCausalLM, CohereConfig, Gemma2Config

    common = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        head_dim=8,
        pad_token_id=0,
    )
    if family == "gemma2":
        config = Gemma2Config(final_logit_softcapping=0.5, sliding_window=4, **common)
    else:
        config = CohereConfig(logit_scale=3.0, **common)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval().double()
    hydra = HydraModel(model, num_layers_unfrozen=1)
    row = ROWS[0]
    out = hydra.forward_hydra(torch.tensor([row]))
    torch.testing.assert_close(out.logprobs[0], unpadded_logprobs(model, row), atol=FLOAT64_ATOL, rtol=0)


def test_parameter_bytes_are_base_plus_top_copies_plus_value_head():
    model = tiny_model("llama")
    base = sum(p.numel() for p in model.parameters())
    hydra = HydraModel(model, num_layers_unfrozen=2)
    layer = sum(p.numel() for p in model.model.layers[0].parameters())
    value_head = 32 * 64 + 64 + 64 + 1
    assert sum(p.numel() for p in hydra.parameters()) == base + 2 * layer + value_head


def test_explicit_layers_path_and_clear_errors():
    model = tiny_model("llama")
    HydraModel(model, num_layers_unfrozen=1, layers_path="model.layers")
    with pytest.raises(UnsupportedModelError, match="not name an nn.ModuleList"):
        HydraModel(tiny_model("llama"), layers_path="model.nothing")
    with pytest.raises(ValueError, match="out of range.*4 decoder layers"):
        HydraModel(tiny_model("llama"), num_layers_unfrozen=-2)
    with pytest.raises(TypeError, match="must be an int"):
        HydraModel(tiny_model("llama"), num_layers_unfrozen=1.5)
    with pytest.raises(UnsupportedModelError, match="float16 weights on the CPU"):
        HydraModel(tiny_model("llama").half())

    class Stacked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = tiny_model("llama").config
            self.stack = torch.nn.ModuleList([torch.nn.Linear(4, 4)])

    with pytest.raises(UnsupportedModelError, match="cannot find the decoder layer list of Stacked.*layers_path="):
        HydraModel(Stacked())
    with pytest.raises(TypeError, match="wraps a transformers causal LM"):
        HydraModel(torch.nn.Linear(2, 2))

    meta_model = tiny_model("llama").to("meta")
    with pytest.raises(UnsupportedModelError, match="meta device"):
        HydraModel(meta_model)


def test_reward_branch_must_match_the_split():
    hydra = HydraModel(tiny_model("llama"), num_layers_unfrozen=2)
    other = HydraModel(tiny_model("llama"), num_layers_unfrozen=1)
    with pytest.raises(ValueError, match="same num_layers_unfrozen"):
        hydra.attach_reward_branch(other.new_reward_branch())


def test_logprobs_from_skips_the_prompt_and_keeps_shapes():
    hydra = HydraModel(tiny64("llama"), num_layers_unfrozen=2)
    ids, mask = left_padded_batch(ROWS)
    full = hydra.forward_hydra(ids, mask, return_entropy=True)
    part = hydra.forward_hydra(ids, mask, return_entropy=True, logprobs_from=9)
    assert part.logprobs.shape == full.logprobs.shape
    torch.testing.assert_close(part.logprobs[:, 9:], full.logprobs[:, 9:], atol=FLOAT64_ATOL, rtol=0)
    torch.testing.assert_close(part.ref_logprobs[:, 9:], full.ref_logprobs[:, 9:], atol=FLOAT64_ATOL, rtol=0)
    torch.testing.assert_close(part.entropy[:, 9:], full.entropy[:, 9:], atol=FLOAT64_ATOL, rtol=0)
    assert torch.all(part.logprobs[:, :9] == 0) and torch.all(part.entropy[:, :9] == 0)
    top = hydra.forward_top(full.split_hidden, ids, mask, logprobs_from=9)
    torch.testing.assert_close(top.logprobs, part.logprobs, atol=FLOAT64_ATOL, rtol=0)
