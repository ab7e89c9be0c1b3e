"""The checks every new hydra runs on a probe (HydraModel._verify): its passes reproduce the
model's own logits, the cached split replays them from the top layers, and (where the model's
attention allows) rows that share a prompt give, packed, the hidden states they give whole
(model/shared_prompt.py). A model that fails one of the first two is refused loudly instead of
training on wrong numbers; one that fails the third passes every row whole."""

from __future__ import annotations

import torch

from .arch import UnsupportedModelError, output_embeddings
from .heads import widened
from .shared_prompt import plan_packing
from .split import position_ids_from_mask


@torch.no_grad()
def verify(hydra) -> None:
    """Check on a short probe that hydrappo's passes reproduce the model's own logits; record the
    decoder layers' output form (hydra._layer_tuple_len, for SkipLayer) and whether shared
    prompts pack exactly (hydra.shares_prompts, hydra.prompt_sharing_problem)."""
    model = hydra.model
    vocab = output_embeddings(model).weight.shape[0]
    generator = torch.Generator().manual_seed(0)
    probe = torch.randint(0, vocab, (1, 6), generator=generator).to(hydra.device)
    mask = torch.ones_like(probe)

    first_layer_output = {}
    handle = hydra.arch.layers[0].register_forward_hook(
        lambda module, args, output: first_layer_output.setdefault("output", output)
    )
    try:
        expected = widened(model(input_ids=probe, attention_mask=mask, use_cache=False).logits)
    finally:
        handle.remove()
    output = first_layer_output.get("output")
    hydra._layer_tuple_len = len(output) if isinstance(output, tuple) else 0

    out = hydra.forward_hydra(probe, mask, return_logits=True)
    wide = (torch.float32, torch.float64)
    tolerance = 1e-4 if expected.dtype in wide and out.logits.dtype in wide else 5e-2
    scale = expected.abs().max().clamp(min=1.0)
    if not torch.allclose(out.logits.to(expected.dtype), expected, atol=tolerance * scale, rtol=0):
        raise UnsupportedModelError(
            f"hydrappo's policy logits differ from {type(model).__name__}'s own: the model post-processes "
            "its logits in a way hydrappo does not know (see hydrappo/arch.py:logits_transform)."
        )
    if hydra.full_model:
        return
    top = hydra.forward_top(out.split_hidden, probe, mask, return_logits=True)
    if not torch.allclose(top.logits.float(), out.logits.float(), atol=tolerance * scale, rtol=0):
        raise UnsupportedModelError(
            f"{type(model).__name__} carries state between decoder layers besides the hidden states, "
            "so its trunk cannot be split and replayed from the top layers."
        )
    hydra.prompt_sharing_problem = prompt_sharing_problem(hydra, vocab, tolerance)
    hydra.shares_prompts = hydra.prompt_sharing_problem is None


@torch.no_grad()
def prompt_sharing_problem(hydra, vocab: int, tolerance: float) -> str | None:
    """Why rows that share a prompt cannot pass it once on this model, or None when the packed
    pass gives the plain pass's hidden states on a probe: two rows share a prompt, a third has a
    left-padded one, one response is right-padded."""
    name = type(hydra.model).__name__
    implementation = getattr(hydra.model.config, "_attn_implementation", None)
    if implementation not in ("sdpa", "eager"):
        return f"attention {implementation!r} (packing takes 'sdpa' or 'eager')"
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (3, 6), generator=generator)
    ids[1, :3] = ids[0, :3]
    mask = torch.ones_like(ids)
    mask[2, 0] = 0
    mask[1, 5] = 0
    ids, mask = ids.to(hydra.device), mask.to(hydra.device)
    position_ids = position_ids_from_mask(mask)
    split_hidden = hydra.split_hidden_states(ids, mask)
    plain = hydra._branch_hidden(split_hidden, ids, mask, position_ids, None, None)
    packing = plan_packing(hydra.model.config, ids, mask, position_ids, 3, split_hidden.dtype, responses_per_row=2)
    if packing is None:
        return f"{name}'s attention window is shorter than the probe"
    try:
        packed = hydra._branch_hidden(split_hidden, ids, mask, position_ids, None, None, packing)
    except Exception as error:  # a model whose attention does not take a custom 4-D mask
        return f"{name} refused a 4-D attention mask ({type(error).__name__}: {error})"
    real = mask.bool()
    expected, got = plain[real], packed[real]
    if not torch.isfinite(expected).all():
        return f"{name}'s plain pass of the probe is not finite"
    scale = expected.abs().max().clamp(min=1.0)
    if not torch.allclose(got.to(expected.dtype), expected, atol=tolerance * scale, rtol=0):
        return f"{name}'s attention does not follow a 4-D attention mask exactly"
    return None
