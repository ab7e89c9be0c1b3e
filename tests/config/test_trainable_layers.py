"""model.trainable_layers, the band of layers that trains: its syntax, the options it cannot serve,
and how it meets num_layers_unfrozen (the command line wins over the file, both at one level are
refused), all before anything loads."""

from __future__ import annotations

import pytest

from hydrappo.config import Config, ConfigError, parse_config
from hydrappo.config.parse import load_yaml
from hydrappo.storage.resume import resume_differences

from runs import TINY


def config_from(tmp_path, model: dict, *overrides):
    """examples/tiny's config with its model section replaced by `model` (plus the paths it needs)."""
    text = (TINY / "config.yaml").read_text()
    body = text[text.index("generation:") :]
    lines = "".join(f"  {key}: {value}\n" for key, value in model.items())
    path = tmp_path / "config.yaml"
    path.write_text(f"model:\n  name_or_path: {TINY / 'model'}\n  random_init: true\n{lines}{body}")
    (tmp_path / "reward.py").write_text((TINY / "reward.py").read_text())
    (tmp_path / "prompts.jsonl").write_text((TINY / "prompts.jsonl").read_text())
    return parse_config(path, list(overrides))


def test_an_unquoted_band_in_yaml_is_text_not_a_base_60_number():
    assert load_yaml("a: 12:16\nb: '12:16'\nc: 12\nd: 0x1f\ne: 1_000") == {
        "a": "12:16",
        "b": "12:16",
        "c": 12,
        "d": 31,
        "e": 1000,
    }


def test_the_command_line_band_replaces_the_files_top_n(tmp_path):
    config = config_from(tmp_path, {"num_layers_unfrozen": 3}, "--trainable_layers", "1:3")
    assert (config.model.trainable_layers, config.model.num_layers_unfrozen) == ("1:3", 2)
    config = config_from(tmp_path, {"trainable_layers": "1:3"}, "--num_layers_unfrozen", "3")
    assert (config.model.trainable_layers, config.model.num_layers_unfrozen) == (None, 3)
    config = config_from(tmp_path, {"trainable_layers": "1:3"})
    assert config.model.trainable_layers == "1:3"


def test_both_at_one_level_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="the command line sets both .*keep one"):
        config_from(tmp_path, {}, "--trainable_layers", "1:3", "--num_layers_unfrozen", "2")
    with pytest.raises(ConfigError, match="the config sets both .*keep one"):
        config_from(tmp_path, {"trainable_layers": "1:3", "num_layers_unfrozen": 2})
    # Through the Python API (no file, no command line): a band beside a top N that is not the default.
    config = Config()
    config.model.trainable_layers, config.model.num_layers_unfrozen = "1:3", 4
    from hydrappo.config import validate

    with pytest.raises(ConfigError, match="num_layers_unfrozen=4 both say which layers train"):
        validate(config)


@pytest.mark.parametrize(
    "band, extra, message",
    [
        ("0:2", [], "leaves no frozen layer below the band.*start at layer 1 or above"),
        ("3:3", [], "is empty.*'3:5' for two layers"),
        ("1-3", [], "is not a band of layers; write START:END"),
        ("1:0.5", [], "mixes a layer index and a fraction of the depth"),
        ("0.5:1.5", [], "is past the top.*fractions lie in 0..1"),
        ("0.75:0.25", [], "is empty"),
        (
            "1:3",
            ["--lora_r", "4", "--lora_layers", "all", "--train_lm_head", "false"],
            "LoRA in every layer.*lora_layers: top",
        ),
    ],
)
def test_bands_that_cannot_work_are_refused_before_loading(tmp_path, band, extra, message):
    with pytest.raises(ConfigError, match=message):
        config_from(tmp_path, {}, "--trainable_layers", band, *extra)


def test_a_band_past_the_models_top_is_refused_with_its_layer_count_before_loading(tmp_path, monkeypatch):
    from hydrappo.storage import models

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(models, "load_model_and_tokenizer", no_loading)
    config = config_from(tmp_path, {}, "--trainable_layers", "2:6")
    with pytest.raises(ConfigError, match="4 decoder layers.*end at 4 or below"):
        models.build_hydra(config.model)


def test_a_band_by_depth_passes_the_checks_and_resolves_on_the_models_layers(tmp_path, monkeypatch):
    config = config_from(tmp_path, {"trainable_layers": "0.25:0.75"})
    assert config.model.trainable_layers == "0.25:0.75"
    config = config_from(tmp_path, {}, "--trainable_layers", "0.5:")
    from hydrappo.storage import models

    hydra, _ = models.build_hydra(config.model, value_head=False)
    assert (hydra.split_index, hydra.band_end) == (2, 4)  # the tiny model's 4 layers


def test_a_band_by_depth_past_a_small_models_top_is_refused_before_loading(tmp_path, monkeypatch):
    from hydrappo.storage import models

    monkeypatch.setattr(models, "load_model_and_tokenizer", lambda *a, **k: pytest.fail("the model was loaded"))
    config = config_from(tmp_path, {}, "--trainable_layers", "0.99:")
    hydra_layers = models.check_band_fits(config.model)  # 4 layers: 0.99 -> layer 3, the top one
    assert hydra_layers is None


def test_resume_refuses_another_band():
    saved, now = Config().to_dict(), Config().to_dict()
    saved["model"]["trainable_layers"], now["model"]["trainable_layers"] = "1:3", "2:4"
    refusals, warnings = resume_differences(saved, now)
    assert (
        refusals
        == [
            "model.trainable_layers: '1:3' in the checkpoint, '2:4' now; it decides which weights the "
            "checkpoint holds; resume with '1:3' or start a new run"
        ]
        and not warnings
    )
