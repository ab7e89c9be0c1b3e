"""A band of trainable layers in the middle of the stack (model.trainable_layers): the same
exactness as the top-N hydra on every architecture of test_hydra.py, in float64 within
FLOAT64_ATOL (tests/helpers/tiny.py says why), and the layers above the band shared, not copied."""

import logging

import pytest
import torch
from transformers import AutoModelForCausalLM, CohereConfig, Gemma2Config

from hydrappo import HydraModel
from hydrappo.model.band import (
    band_as_fractions,
    band_problem,
    describe_band,
    parse_band,
    resolve_band,
    trainable_range,
)

from tiny import FAMILIES, FLOAT64_ATOL, LAYERS, VOCAB, left_padded_batch, tiny64, tiny_model

ROWS = [list(range(5, 19)), [20, 21, 22, 23, 24], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39]]
BAND = "1:3"  # of the tiny models' 4 layers: one frozen below, two training, one frozen above


def postprocessing_model(family):
    """The 3-layer models of test_hydra.py whose logits the model post-processes (softcap, scale)."""
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
    return AutoModelForCausalLM.from_config(config).eval().double()


ARCHITECTURES = [*FAMILIES, "gemma2", "cohere"]


def model_and_band(family):
    if family in ("gemma2", "cohere"):
        return postprocessing_model(family), "1:2"
    return tiny64(family), BAND


def row_values(tensor, row_index, length):
    return tensor[row_index, tensor.shape[1] - length :]


def own_logits(model, row):
    with torch.no_grad():
        return model(torch.tensor([row])).logits[0]


@pytest.mark.parametrize("family", ARCHITECTURES)
def test_band_policy_and_reference_equal_the_unwrapped_model(family):
    model, band = model_and_band(family)
    original = {name: p.clone() for name, p in model.named_parameters()}
    hydra = HydraModel(model, trainable_layers=band)
    assert hydra.is_band and hydra.split_index == 1
    # One left-padded batch; the softcapped Gemma2 gives NaN on left-padded rows by itself (as the
    # unwrapped model does), so those two models run each row alone, as test_hydra.py runs them.
    batches = [ROWS] if family in FAMILIES else [[row] for row in ROWS]
    for rows in batches:
        ids, mask = left_padded_batch(rows)
        with torch.no_grad():
            out = hydra.forward_hydra(ids, mask, return_logits=True, return_entropy=True)
        for i, row in enumerate(rows):
            expected = own_logits(model, row)  # each row alone, unpadded
            for name in ("logits", "ref_logits"):
                torch.testing.assert_close(
                    row_values(getattr(out, name), i, len(row)), expected, atol=FLOAT64_ATOL, rtol=0
                )
            targets = torch.tensor(row[1:])[:, None]
            expected_logprobs = expected[:-1].log_softmax(-1).gather(-1, targets)[:, 0]
            for name in ("logprobs", "ref_logprobs"):
                torch.testing.assert_close(
                    row_values(getattr(out, name), i, len(row) - 1), expected_logprobs, atol=FLOAT64_ATOL, rtol=0
                )
        # The policy from the cached split (what the PPO epochs run) equals the whole pass.
        top = hydra.forward_top(out.split_hidden, ids, mask, return_entropy=True)
        for name in ("logprobs", "values", "entropy"):
            torch.testing.assert_close(getattr(top, name), getattr(out, name), atol=FLOAT64_ATOL, rtol=0)
    assert all(
        torch.equal(p, original[name[len("model.") :]])
        for name, p in hydra.named_parameters()
        if name.startswith("model.")
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_a_step_trains_the_band_only_and_the_reference_stays_the_original(family):
    model = tiny64(family)
    hydra = HydraModel(model, trainable_layers=BAND)
    layers = hydra.arch.layers
    band = {id(p) for layer in layers[1:3] for p in layer.parameters()}
    ids, mask = left_padded_batch(ROWS)
    before = hydra.forward_hydra(ids, mask)
    optimizer = torch.optim.SGD(hydra.trainable_parameters(), lr=0.5)
    advantages = torch.linspace(-1, 1, before.logprobs.shape[1]).expand_as(before.logprobs)
    (-(advantages * before.logprobs).mean() + 0.1 * (before.values - 1.0).pow(2).mean()).backward()
    for name, param in hydra.named_parameters():
        trains = id(param) in band or name.startswith("value_head.")
        assert param.requires_grad == trains and (param.grad is not None) == trains, name
    optimizer.step()
    after = hydra.forward_hydra(ids, mask)
    assert (after.logprobs - before.logprobs).abs().max() > 1e-3
    torch.testing.assert_close(after.ref_logprobs, before.ref_logprobs, atol=0, rtol=0)
    assert torch.equal(after.split_hidden, before.split_hidden)
    fresh = tiny64(family)
    for i, row in enumerate(ROWS):
        expected = own_logits(fresh, row)[:-1].log_softmax(-1).gather(-1, torch.tensor(row[1:])[:, None])[:, 0]
        torch.testing.assert_close(row_values(after.ref_logprobs, i, len(row) - 1), expected, atol=FLOAT64_ATOL, rtol=0)


def test_only_the_band_is_copied_and_the_layers_above_are_shared():
    model = tiny_model("llama")
    base = sum(p.numel() for p in model.parameters())
    hydra = HydraModel(model, trainable_layers=BAND)
    layer = sum(p.numel() for p in model.model.layers[0].parameters())
    value_head = 32 * 64 + 64 + 64 + 1
    assert len(hydra.ref_layers) == 2
    assert sum(p.numel() for p in hydra.parameters()) == base + 2 * layer + value_head
    assert len(hydra.state_dict()) == len(model.state_dict()) + len(hydra.ref_layers.state_dict()) + len(
        hydra.value_head.state_dict()
    )
    assert hydra.arch.layers[3] is model.model.layers[3]


def test_an_open_band_is_the_top_n():
    hydra = HydraModel(tiny64("llama"), trainable_layers="2:")
    assert (hydra.split_index, hydra.band_end, hydra.num_layers_unfrozen, hydra.is_band) == (2, LAYERS, 2, False)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_bands_reward_branch_runs_from_the_split_to_the_top(family):
    model = tiny64(family)
    hydra = HydraModel(model, trainable_layers=BAND)
    branch = hydra.new_reward_branch()
    assert len(branch.layers) == hydra.branch_depth == LAYERS - 1
    with torch.no_grad():  # the policy moves: the branch keeps the original band
        for p in hydra.arch.layers[1].parameters():
            p.add_(0.1)
    hydra.attach_reward_branch(branch)
    ids, mask = left_padded_batch(ROWS)
    with torch.no_grad():
        scores = hydra.forward_hydra(ids, mask).scores
        fresh = tiny64(family)
        for i, row in enumerate(ROWS):
            final = fresh(torch.tensor([row]), output_hidden_states=True).hidden_states[-1][0, -1]
            torch.testing.assert_close(scores[i], branch.head(final), atol=FLOAT64_ATOL, rtol=0)
    other = HydraModel(tiny_model("llama"), trainable_layers="2:3")
    with pytest.raises(ValueError, match="3 layers but the hydra splits the trunk 2 layers below the top"):
        other.attach_reward_branch(HydraModel(tiny_model("llama"), trainable_layers=BAND).new_reward_branch())


@pytest.mark.parametrize(
    "band, message",
    [
        ("0:2", "leaves no frozen layer below the band.*start at layer 1"),
        ("2:2", "is empty"),
        ("3:1", "is empty"),
        ("2:9", "runs past the top of the model, which has 4 decoder layers.*end at 4 or below"),
        ("4:", "runs past the top"),
        ("two:four", "is not a band of layers: write START:END"),
    ],
)
def test_bands_that_cannot_work_are_refused_with_what_would(band, message):
    with pytest.raises(ValueError, match=message):
        HydraModel(tiny_model("llama"), trainable_layers=band)


def test_a_band_with_adapters_in_every_layer_is_refused():
    from peft import LoraConfig

    with pytest.raises(ValueError, match="lora_layers='all'.*lora_layers='top'"):
        HydraModel(
            tiny_model("llama"),
            trainable_layers=BAND,
            lora=LoraConfig(r=2, target_modules="all-linear"),
            lora_layers="all",
        )


def test_lora_on_the_band_adapts_the_band_only_and_the_reference_is_the_base():
    from peft import LoraConfig
    from peft.tuners.tuners_utils import BaseTunerLayer

    from hydrappo.model.lora import merged_model

    lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    hydra = HydraModel(tiny64("llama"), trainable_layers=BAND, lora=lora)
    adapted = [
        i for i, layer in enumerate(hydra.arch.layers) if any(isinstance(m, BaseTunerLayer) for m in layer.modules())
    ]
    assert adapted == [1, 2] and len(hydra.ref_layers) == 0
    ids, mask = left_padded_batch(ROWS)
    with torch.no_grad():
        out = hydra.forward_hydra(ids, mask, return_logits=True)
        top = hydra.forward_top(out.split_hidden, ids, mask)
        merged = merged_model(hydra)
        fresh = tiny64("llama")
        for i, row in enumerate(ROWS):
            torch.testing.assert_close(
                row_values(out.ref_logits, i, len(row)), own_logits(fresh, row), atol=FLOAT64_ATOL, rtol=0
            )
            torch.testing.assert_close(
                row_values(out.logits, i, len(row)), own_logits(merged, row), atol=FLOAT64_ATOL, rtol=0
            )
    assert (out.logits - out.ref_logits).abs().max() > 1e-3  # the adapters act (init_lora_weights=False)
    torch.testing.assert_close(top.logprobs, out.logprobs, atol=FLOAT64_ATOL, rtol=0)
    branch = hydra.new_reward_branch()
    assert len(branch.layers) == 3 and not any(isinstance(m, BaseTunerLayer) for m in branch.modules())


def test_the_band_syntax():
    assert parse_band("12:16") == (12, 16) and parse_band(" 3 : ") == (3, None) and parse_band((2, 5)) == (2, 5)
    assert parse_band("0.43:0.57") == (0.43, 0.57) and parse_band("0.5:") == (0.5, None) and parse_band(".5:1.0")
    for text in ("12", "12:16:2", "-1:4", "a:b", 736, ":0.5", "0.5.1:0.6"):
        with pytest.raises(ValueError, match="START:END"):
            parse_band(text)
    for text in ("13:0.5", "0.5:13", "1.5:2"):
        with pytest.raises(ValueError, match="mixes a layer index and a fraction.*'13:17'.*'0.43:0.57'"):
            parse_band(text)


@pytest.mark.parametrize(
    "text, layers, expected",
    [
        ("0.43:0.57", 30, (13, 17)),  # SmolLM2-135M: the examples' 13:17 (12.9 -> 13, 17.1 -> 17)
        ("0.43:0.57", 18, (8, 10)),  # Gemma 3 270M: 7.74 -> 8, 10.26 -> 10
        ("0.5:", 30, (15, 30)),
        ("0.5:", 18, (9, 18)),
        ("0.15:0.25", 30, (5, 8)),  # a half rounds up (4.5 -> 5, 7.5 -> 8), float error included
        ("0.0:0.1", 30, (1, 3)),  # one frozen layer stays below
        ("0.5:0.51", 18, (9, 10)),  # one layer at least
        ("0.99:", 30, (29, 30)),  # the top layer, never past it
        ("13:17", 18, (13, 17)),  # indices keep their meaning
        ("13:", 18, (13, 18)),
    ],
)
def test_fractions_of_the_depth_resolve_to_whole_layers(text, layers, expected):
    assert resolve_band(parse_band(text), layers) == expected
    assert band_problem(parse_band(text), layers) is None
    assert trainable_range(2, text, layers) == expected


def test_a_bad_band_of_fractions_says_why():
    assert "past the top" in band_problem(parse_band("1.0:"))[0]
    assert "past the top" in band_problem(parse_band("0.5:1.2"))[0]
    assert "is empty" in band_problem(parse_band("0.6:0.5"))[0]
    # On a model with too few layers the problem names the layers the fractions resolved to.
    rule, fix = band_problem(parse_band("0.5:"), 1)
    assert rule.startswith("resolves to '1:2' of 1 layers, which runs past the top") and "end at 1" in fix


def test_a_fractional_band_is_logged_with_the_models_layer_count(caplog):
    assert describe_band("0.43:0.57", 30) == "trainable layers 0.43:0.57 of 30 -> 13:17"
    with caplog.at_level(logging.INFO, logger="hydrappo"):
        hydra = HydraModel(tiny64("llama"), trainable_layers="0.25:0.75", verify=False)
    assert (hydra.split_index, hydra.band_end) == (1, 3)
    assert "trainable layers 0.25:0.75 of 4 -> 1:3" in caplog.text


def test_the_recorded_split_is_the_input_of_the_bands_first_layer():
    hydra = HydraModel(tiny64("llama"), trainable_layers=BAND)
    ids, mask = left_padded_batch(ROWS)
    seen = {}

    def keep_input(module, args, kwargs):
        seen["input"] = (args[0] if args else kwargs["hidden_states"]).clone()

    handle = hydra.arch.layers[1].register_forward_pre_hook(keep_input, with_kwargs=True)
    try:
        with torch.no_grad():
            hydra.model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0))
    finally:
        handle.remove()
    assert torch.equal(hydra.split_hidden_states(ids, mask), seen["input"])


@pytest.mark.parametrize(
    "start, end, layers, expected",
    [
        (13, 17, 30, "0.43:0.57"),  # the arithmetic band on SmolLM2-135M
        (8, 10, 18, "0.44:0.56"),  # Gemma 3 270M's middle
        (2, 4, 4, "0.5:"),  # to the top: an open end (a bare 1 would read as a layer index)
        (1, 2, 300, "0.003:0.007"),  # two decimals cannot tell layer 1 from 0 here
    ],
)
def test_a_band_as_fractions_resolves_back_to_its_layers(start, end, layers, expected):
    assert band_as_fractions(start, end, layers) == expected
    assert resolve_band(parse_band(expected), layers) == (start, end)


def test_every_band_has_fractions_that_resolve_back_to_it():
    for layers in (4, 18, 30, 100):
        for start in range(1, layers):
            for end in range(start + 1, min(layers, start + 5) + 1):
                assert resolve_band(parse_band(band_as_fractions(start, end, layers)), layers) == (start, end)
    with pytest.raises(ValueError, match="no band"):
        band_as_fractions(0, 2, 30)
