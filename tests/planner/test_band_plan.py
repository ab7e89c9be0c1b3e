"""The planner for a band of trainable layers (hydrappo memory --trainable-layers): what it
shares with top N of the same width, and what it shares with top N of the same split."""

from __future__ import annotations

import pytest

from hydrappo.cli import main as cli_main
from hydrappo.planner.plan import plan_memory
from hydrappo.planner.presets import preset_config
from hydrappo.planner.settings import TrainingSettings


def test_a_band_costs_its_width_in_weights_and_its_split_in_activations():
    config, first = preset_config("llama-3.1-8b"), None

    def parts(**settings) -> dict[tuple[str, str], int]:
        nonlocal first
        reuse = {"counts": first.counts, "trace": first.activation} if first else {}
        plan = plan_memory(config, TrainingSettings(trunk_quantization="int8", **settings), "llama-3.1-8b", **reuse)
        first = first or plan
        return {(c.name, c.phase): c.bytes for c in plan.hydra.components}

    band = parts(trainable_layers="12:14")
    top_2, top_20 = parts(num_layers_unfrozen=2), parts(num_layers_unfrozen=20)  # the same width; the same split
    trace = first.activation
    same_width = [
        ("reference copy", "static"),
        ("gradients", "update"),
        ("optimizer state", "static"),
        ("fp32 master weights", "static"),
    ]
    assert all(band[key] == top_2[key] for key in same_width)
    # The reward branch copies split-to-top; int8 covers the 12 layers below the band.
    assert band[("reward branch", "static")] == top_20[("reward branch", "static")]
    assert band[("weights", "static")] == top_20[("weights", "static")] != top_2[("weights", "static")]
    # The backward runs through the 18 frozen layers above the band: their activations are kept.
    assert band[("activations", "update")] == top_2[("activations", "update")] + 18 * trace.layer


@pytest.mark.parametrize(
    "band, message", [("0:4", "no frozen layer below"), ("30:40", "32 decoder layers"), ("4:4", "empty")]
)
def test_hydrappo_memory_refuses_a_band_that_cannot_work(band, message, capsys):
    assert cli_main(["memory", "llama-3.1-8b", "--trainable-layers", band]) == 2
    assert message in capsys.readouterr().err


def test_hydrappo_memory_takes_a_band_or_a_top_n_not_both(capsys):
    assert cli_main(["memory", "llama-3.1-8b", "--trainable-layers", "12:16"]) == 0
    assert "trainable layers 12:16, full band" in capsys.readouterr().out
    assert cli_main(["memory", "llama-3.1-8b", "--trainable-layers", "12:16", "-N", "2"]) == 2
    assert "not allowed with argument --trainable-layers" in capsys.readouterr().err
