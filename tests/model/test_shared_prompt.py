"""Rows that share a prompt pass it once (model/shared_prompt.py): the packing's layout and mask
by hand, and the packed pass against the plain one on the tiny models in float64 (log-probs,
values, the reference, and the gradients of a loss), with fewer tokens through the top layers."""

import pytest
import torch

from hydrappo import HydraModel
from hydrappo.model.shared_prompt import attention_window, pack_shared_prompts, responses_per_packed_row

from tiny import FLOAT64_ATOL, VOCAB, first_family_quick, tiny64


def test_packing_lays_each_prompt_out_once_and_masks_by_hand():
    # Rows 0 and 2 share the prompt [5, 6]; row 1's prompt [0, 7] is left-padded; row 2's
    # response is right-padded. Width 4: prompt columns 0-1, response columns 2-3.
    ids = torch.tensor([[5, 6, 10, 11], [0, 7, 12, 13], [5, 6, 14, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1], [1, 1, 1, 0]])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    packing = pack_shared_prompts(ids, mask, positions, 2, responses_per_row=4)

    rows = {tuple(row[:2]): row for row in packing.input_ids.tolist()}
    # [prompt | row 0's response | row 2's response without its padding | a padding column]
    assert rows[(5, 6)][:5] == [5, 6, 10, 11, 14]
    assert rows[(0, 7)][:4] == [0, 7, 12, 13]
    shared = [row[:2] for row in packing.input_ids.tolist()].index([5, 6])
    assert packing.position_ids[shared, :5].tolist() == [0, 1, 2, 3, 2]
    allowed = packing.attention_mask[shared, 0].int()
    assert allowed.tolist() == [
        [1, 0, 0, 0, 0, 0],  # prompt: causal
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],  # row 0's response: the prompt and itself
        [1, 1, 1, 1, 0, 0],
        [1, 1, 0, 0, 1, 0],  # row 2's response: the prompt, not row 0's response
        [0, 0, 0, 0, 0, 1],  # the padding column: itself only (finite, never read)
    ]
    other = 1 - shared
    assert packing.attention_mask[other, 0, 1].int().tolist()[:2] == [0, 1]  # the left pad is no key
    # Unpacking gives every row's real tokens back; its padding columns read the padding column.
    back = packing.unpack(packing.input_ids)
    assert torch.equal(back[mask.bool()], ids[mask.bool()])
    assert packing.packed_tokens == 12


def test_nothing_is_packed_where_nothing_is_shared_or_it_would_not_pay():
    ids = torch.tensor([[5, 6, 10], [7, 8, 12]])
    mask = torch.ones_like(ids)
    assert pack_shared_prompts(ids, mask, mask.cumsum(-1) - 1, 2, responses_per_row=4) is None
    same = torch.tensor([[5, 6, 10], [5, 6, 12]])
    assert pack_shared_prompts(same, mask, mask.cumsum(-1) - 1, 2, responses_per_row=1) is None


def test_responses_per_packed_row_keeps_attention_within_the_rows_it_replaces():
    # (P + kR)^2 <= k (P + R)^2, by hand for the reasoning example's P 67, R 24 (91^2 = 8281):
    # k = 7: 235^2 = 55225 <= 7 x 8281 = 57967; k = 8: 259^2 = 67081 > 66248.
    assert responses_per_packed_row(67, 24) == 7
    assert responses_per_packed_row(10, 10) == 1  # (10 + 20)^2 = 900 > 2 * 400: no sharing
    assert responses_per_packed_row(100, 1) > 100


# Llama-style RMSNorm computes in float32 even in a float64 model (transformers' LlamaRMSNorm casts
# up and back), so its backward rounds each token's gradient to float32. The packed pass sums a
# shared prompt position's gradient over its rows BEFORE that rounding, the plain pass after: a
# weight's gradient, a sum over <= 77 tokens through <= 5 norms, then differs by up to 77 x 5 x
# 2**-24 (2.3e-5) of its scale. A token counted twice, or missed, moves it by ~1/77 (1.3e-2).
FLOAT32_NORM_ROUNDING = 77 * 5 * 2**-24


def grouped_batch(generator):
    """Two prompts of 3 responses each (one prompt left-padded) and a prompt of its own; some
    responses right-padded. Prompt width 8, response width 3 (responses_per_packed_row: 4)."""
    ids = torch.randint(4, VOCAB, (7, 11), generator=generator)
    mask = torch.ones_like(ids)
    for row in (1, 2):
        ids[row, :8] = ids[0, :8]
    ids[3, :2], mask[3, :2] = 0, 0
    for row in (4, 5):
        ids[row, :8] = ids[3, :8]
        mask[row, :8] = mask[3, :8]
    for row, length in ((1, 2), (4, 1), (6, 2)):
        ids[row, 8 + length :], mask[row, 8 + length :] = 0, 0
    return ids, mask


def top_layer_tokens(hydra):
    """A counter of the tokens entering the first trainable layer, and its hook's handle."""
    seen = []
    layer = hydra.arch.layers[hydra.split_index]
    handle = layer.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append((args[0] if args else kwargs["hidden_states"]).shape[:2].numel()),
        with_kwargs=True,
    )
    return seen, handle


@pytest.mark.parametrize("family", first_family_quick())
def test_the_packed_pass_equals_the_plain_one_with_its_gradients(family):
    hydra = HydraModel(tiny64(family), num_layers_unfrozen=2)
    ids, mask = grouped_batch(torch.Generator().manual_seed(0))
    real = mask[:, 8:].bool()
    window = attention_window(hydra.model.config)
    assert hydra.shares_prompts, hydra.prompt_sharing_problem
    split = hydra.forward_hydra(ids, mask).split_hidden

    def run(shared):
        hydra.zero_grad()
        seen, handle = top_layer_tokens(hydra)
        try:
            out = hydra.forward_top(split, ids, mask, return_entropy=True, logprobs_from=7, shared_prompt_width=shared)
        finally:
            handle.remove()
        response = out.logprobs[:, 7:]
        loss = -(torch.linspace(-1, 1, response.numel()).view_as(response) * response).sum() + out.values.pow(2).sum()
        loss.backward()
        grads = {name: p.grad.clone() for name, p in hydra.named_parameters() if p.grad is not None}
        ref = hydra.forward_hydra(ids, mask, logprobs_from=7, split_hidden=split, shared_prompt_width=shared)
        return out, grads, ref.ref_logprobs, seen[0]

    plain, plain_grads, plain_ref, plain_tokens = run(None)
    packed, packed_grads, packed_ref, packed_tokens = run(8)
    for name in ("logprobs", "entropy"):
        torch.testing.assert_close(
            getattr(packed, name)[:, 7:][real], getattr(plain, name)[:, 7:][real], atol=FLOAT64_ATOL, rtol=0
        )
    torch.testing.assert_close(packed.values[mask.bool()], plain.values[mask.bool()], atol=FLOAT64_ATOL, rtol=0)
    torch.testing.assert_close(packed_ref[:, 7:][real], plain_ref[:, 7:][real], atol=FLOAT64_ATOL, rtol=0)
    assert plain_grads.keys() == packed_grads.keys() and plain_grads
    for name, grad in plain_grads.items():
        bound = FLOAT64_ATOL + FLOAT32_NORM_ROUNDING * grad.abs().max()
        torch.testing.assert_close(packed_grads[name], grad, atol=bound, rtol=0, msg=name)
    assert plain_tokens == 7 * 11
    if window is not None and window < 11:  # a sliding window shorter than the rows: packed rows would not be exact
        assert packed_tokens == plain_tokens
    else:  # 3 packed rows of 8 prompt columns, the responses' real tokens and a padding column
        assert packed_tokens == 3 * (8 + 3 + 2 + 3 + 1)  # the longest: prompt 1's (3, 2 and 3 tokens)


def test_a_hydra_built_without_its_check_passes_every_row_whole():
    hydra = HydraModel(tiny64("llama"), num_layers_unfrozen=2, verify=False)
    assert not hydra.shares_prompts and "verify=False" in hydra.prompt_sharing_problem
    ids, mask = grouped_batch(torch.Generator().manual_seed(0))
    split = hydra.forward_hydra(ids, mask).split_hidden
    seen, handle = top_layer_tokens(hydra)
    try:
        hydra.forward_top(split, ids, mask, shared_prompt_width=8)
    finally:
        handle.remove()
    assert seen == [7 * 11]
