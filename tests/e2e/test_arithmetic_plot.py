"""examples/arithmetic/plot_eval.py: the held-out curve from a metrics.jsonl written by hand."""

import importlib.util
import json

import pytest

from runs import ROOT

pytest.importorskip("matplotlib")

SCRIPT = ROOT / "examples" / "arithmetic" / "plot_eval.py"
spec = importlib.util.spec_from_file_location("plot_eval", SCRIPT)
plot_eval = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot_eval)


def test_curves_and_png(tmp_path):
    rows = [
        {
            "step": 0,
            "eval/reward/accuracy": 0.3,
            "eval/reward/format_reward": 0.4,
            "eval/missing_eos_frac": 0.6,
            "eval/degenerate_frac": 0.0,
        },
        {"step": 1, "env/reward/accuracy": 0.25},
        {
            "step": 2,
            "env/reward/accuracy": 0.5,
            "eval/reward/accuracy": 0.6,
            "eval/reward/format_reward": 0.9,
            "eval/missing_eos_frac": 0.05,
            "eval/degenerate_frac": 0.01,
        },
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    held_out, train = plot_eval.curves(tmp_path / "metrics.jsonl")
    assert held_out["held-out accuracy"] == [(0, 0.3), (2, 0.6)]
    assert held_out["held-out: ends with EOS"] == [(0, pytest.approx(0.4)), (2, pytest.approx(0.95))]
    assert train == [(1, 0.25), (2, 0.5)]
    assert plot_eval.main([str(tmp_path)]) == 0
    assert (tmp_path / "eval_curve.png").stat().st_size > 1000


def test_every_curve_has_its_own_line_style_and_marker():
    # The format and EOS shares coincide once every answer is one line that ends: with one style for
    # both, the later line hides the earlier one.
    labels = [label for _, label, _ in plot_eval.CURVES]
    assert set(plot_eval.STYLES) == set(labels)
    assert len({plot_eval.STYLES[label]["linestyle"] for label in labels}) == len(labels)
    assert len({plot_eval.STYLES[label]["marker"] for label in labels}) == len(labels)
