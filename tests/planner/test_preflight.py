"""`hydrappo train` on a GPU plans the run against the memory free there before its model loads
(planner/preflight.py). No GPU here: the tests report the free memory of a pretend CUDA device
(`free_gpu_bytes` monkeypatched) and run on `--device cuda`, which nothing touches before the
model loads."""

from __future__ import annotations

import logging

import pytest
import torch

from hydrappo.cli import main
from hydrappo.config import Config, parse_config
from hydrappo.planner import preflight
from hydrappo.planner.settings import FRAGMENTATION, GIB
from hydrappo.storage import models

from runs import TINY

CONFIG = str(TINY / "config.yaml")
CUDA = torch.device("cuda")


def pretend_free(monkeypatch, free: int) -> None:
    monkeypatch.setattr(preflight, "free_gpu_bytes", lambda device: free if device.type == "cuda" else None)


def no_model_loads(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("the model loaded before the memory check")

    monkeypatch.setattr(models, "load_model_and_tokenizer", refuse)


def tiny_config() -> Config:
    return parse_config(CONFIG, ["--device", "cuda"], Config)


def variant_peaks() -> list[preflight.Variant]:
    config = tiny_config()
    settings = preflight.run_settings(config, CUDA)
    return preflight.fitting_variants(preflight._model_config(config), settings, "model", free=0)


def test_a_run_that_will_not_fit_stops_before_the_model_loads(tmp_path, monkeypatch, capsys):
    """Free memory between the lightest variant's need and the run's own: refused after the config is
    read and before any model loads (no_model_loads), with the plan's table and the options that
    would fit, and no output folder. (How long that takes is measured, not asserted: timed
    assertions stay out of the tests.)"""
    variants = variant_peaks()
    as_given, lightest = variants[0].peak, min(row.peak for row in variants)
    assert lightest < as_given
    pretend_free(monkeypatch, int(lightest * FRAGMENTATION) + 1)
    no_model_loads(monkeypatch)
    code = main(["train", CONFIG, "--device", "cuda", "--output_dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "the run will not fit on cuda" in err and "Stopped before the model loads" in err
    assert "hydrappo (one trunk)" in err  # the plan's table
    assert "What would fit" in err and "the first that fits: --" in err
    assert "HYDRAPPO_MEMORY_CHECK=0" in err
    assert not (tmp_path / "out").exists()


def test_a_run_that_fits_logs_its_plan_in_one_line(monkeypatch, caplog):
    pretend_free(monkeypatch, 100 * GIB)
    with caplog.at_level(logging.INFO, logger="hydrappo.planner"):
        line = preflight.check_run_fits(tiny_config(), CUDA)
    assert line.startswith("memory plan: peak ") and "of 100.00 GiB free on cuda" in line and "\n" not in line
    assert line in caplog.messages


def test_nothing_is_planned_on_the_cpu_or_when_switched_off(monkeypatch):
    config = tiny_config()
    assert preflight.free_gpu_bytes(torch.device("cpu")) is None  # the real question, off CUDA
    assert preflight.check_run_fits(config, torch.device("cpu")) is None

    def no_gpu_question(device):
        raise AssertionError("asked a GPU's free memory")

    monkeypatch.setattr(preflight, "free_gpu_bytes", no_gpu_question)
    monkeypatch.setenv(preflight.SWITCH, "0")
    assert preflight.check_run_fits(config, CUDA) is None


@pytest.mark.parametrize(
    "options",
    [
        "--optimizer adamw8bit",
        "--lora_r 16 --train_lm_head false",  # the tiny example trains its head: not beside LoRA
        "--num_layers_unfrozen 1",
        "--trunk_quantization int8",
    ],
)
def test_each_variant_is_named_by_the_train_options_that_select_it(options):
    """What the refusal advises is a valid command line that plans as the variant does."""
    given = preflight.run_settings(tiny_config(), CUDA)
    variant = preflight.run_settings(parse_config(CONFIG, ["--device", "cuda", *options.split()], Config), CUDA)
    assert preflight.train_options(given, variant) == options
