"""hydrappo sweep-layers (train/layer_sweep.py): on a toy whose best layer is known by construction
it ranks that layer first; an interrupted or extended sweep resumes without redoing a layer; a
folder of another sweep, and bad input, are refused in one line; two sweeps' files compare by
Spearman's rho.

The toy: a 4-layer Llama in which every layer but LIVE has its value and output projections of
attention, and the up and down projections of its MLP, set to zero. Such a layer adds nothing to the
residual stream, and its gradient is zero too (each of those weights' gradients passes through
another one of them that is zero; the rest of the layer reaches the output only through them), so
training it alone cannot change a single output: its held-out gain is exactly 0. LIVE is an
ordinary random layer, which the reward (the share of "good" words g0..g7) can move."""

import json
import shutil

import pytest
import torch
import yaml
from transformers import AutoConfig, AutoModelForCausalLM

from hydrappo.cli import main
from hydrappo.train.layer_sweep import RESULTS, SweepResults

from runs import TINY

LIVE = 2


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """A folder with the toy model, training and held-out prompts, and its GRPO config."""
    folder = tmp_path_factory.mktemp("toy")
    config = AutoConfig.from_pretrained(TINY / "model")
    config.initializer_range = 0.1  # embeddings large enough that one layer moves the logits in two steps
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    assert config.num_hidden_layers == 4
    with torch.no_grad():
        for index, layer in enumerate(model.model.layers):
            if index != LIVE:
                for weight in (layer.self_attn.v_proj, layer.self_attn.o_proj, layer.mlp.up_proj, layer.mlp.down_proj):
                    weight.weight.zero_()
    model.save_pretrained(folder / "model")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TINY / "model" / name, folder / "model" / name)
    rows = (TINY / "prompts.jsonl").read_text().splitlines()
    (folder / "train.jsonl").write_text("\n".join(rows[:96]) + "\n")
    (folder / "eval.jsonl").write_text("\n".join(rows[96:112]) + "\n")
    options = {
        "model": {"name_or_path": "model", "num_layers_unfrozen": 1},
        "generation": {"max_new_tokens": 4, "generation_batch_size": 32, "samples_per_prompt": 4},
        "ppo": {
            "advantage_estimator": "grpo",
            "batch_size": 8,
            "mini_batch_size": 8,
            "ppo_epochs": 2,
            "learning_rate": 1e-2,
            "init_kl_coef": 0.0,
            "kl_controller": "fixed",
        },
        "reward": {"reward_fn": f"{TINY / 'reward.py'}:reward_fn"},
        "data": {"prompts": "train.jsonl", "eval_prompts": "eval.jsonl", "max_prompt_length": 16},
        "train": {"output_dir": str(folder / "run"), "total_steps": 20, "seed": 0, "progress_bar": False},
    }
    (folder / "config.yaml").write_text(yaml.safe_dump(options))
    return folder


@pytest.fixture
def one_thread():
    """Matrices this small run fastest on one thread, the more so on a shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def sweep(toy, capsys, *options, code=0) -> tuple[str, str]:
    rc = main(["sweep-layers", str(toy / "config.yaml"), "--steps", "2", *map(str, options)])
    out, err = capsys.readouterr()
    assert rc == code, err
    return out, err


@pytest.mark.slow
def test_the_sweep_ranks_first_the_one_layer_that_can_move_the_output_and_resumes(toy, tmp_path, capsys, one_thread):
    folder = tmp_path / "sweep"
    out, _ = sweep(toy, capsys, "--layers", "2:4", "--output_dir", folder)
    assert "cost: 2 layers x 2 steps = 4 steps and 3 evaluations" in out
    written = (folder / RESULTS).read_bytes()
    assert len(written.splitlines()) == 4  # what it measures, the baseline, layers 2 and 3

    # Extended to every layer: only layer 1 trains; what was written stays as it was.
    out, _ = sweep(toy, capsys, "--layers", "1:4", "--output_dir", folder, "--window", "2")
    assert "(2 layers done already, skipped)" in out and "cost: 1 layer x 2 steps = 2 steps and 1 evaluation" in out
    assert "layer 1 step 1/2" in out and "layer 2 step" not in out and "layer 3 step" not in out
    assert (folder / RESULTS).read_bytes().startswith(written)

    results = SweepResults.read(folder)
    gains = results.gains()
    assert gains[LIVE] > 0
    assert gains[1] == 0.0 and gains[3] == 0.0  # exactly: a layer that cannot move the output moved nothing
    ranking = out[out.index("layers ranked") :].splitlines()
    assert ranking[2].split()[:2] == ["1", str(LIVE)]
    assert "proposed band, the best 2 consecutive layers" in out and "2:4 (0.5: of 4 layers)" in out

    # Done: read again with another window, at no cost (nothing loads, nothing trains), and compared with
    # another sweep: ranks 1.5 3 1.5 against 1 3 2, rho = 1.5 / sqrt(1.5 * 2) = 0.866
    other = write_results(tmp_path / "other" / RESULTS, {1: 0.1, 2: 0.3, 3: 0.2}, seed=1)
    out, _ = sweep(toy, capsys, "--layers", "1:4", "--output_dir", folder, "--window", "1", "--compare", other)
    assert "over their 3 common layers (eval/reward_mean): +0.866" in out
    assert "every one of the 3 layers is done already" in out
    assert "step 1/2" not in out and "baseline (step 0)" not in out
    assert "2:3 (0.5:0.75 of 4 layers)" in out and 'model.trainable_layers: "0.5:0.75"' in out

    # Another learning rate measures something else: refused, the folder as it was.
    kept = (folder / RESULTS).read_bytes()
    _, err = sweep(toy, capsys, "--output_dir", folder, "--learning_rate", "0.02", code=2)
    assert "holds a sweep of another setting (ppo.learning_rate 0.01 there, 0.02 here)" in err
    assert (folder / RESULTS).read_bytes() == kept


@pytest.mark.slow
def test_a_layer_that_takes_the_shared_first_answers_measures_what_it_measures_alone(toy, tmp_path, capsys, one_thread):
    # LIVE after layer 1 takes layer 1's first-step answers and the random state after them; alone, it
    # samples its own. Its steps (the second samples again, from that random state) and its evaluation agree.
    out, _ = sweep(toy, capsys, "--layers", f"1:{LIVE + 1}", "--output_dir", tmp_path / "both")
    assert "taken by 1 more layer" in out
    sweep(toy, capsys, "--layers", f"{LIVE}:{LIVE + 1}", "--output_dir", tmp_path / "alone", "--window", "1")
    shared, alone = (SweepResults.read(tmp_path / name).rows[LIVE] for name in ("both", "alone"))
    assert shared["train"].keys() == alone["train"].keys() and shared["eval"].keys() == alone["eval"].keys()
    for part in ("train", "eval"):
        for key, value in alone[part].items():
            if not key.startswith("time/"):
                assert shared[part][key] == pytest.approx(value, rel=1e-5, abs=1e-6), (part, key)
    assert shared["eval"]["eval/reward_mean"] != SweepResults.read(tmp_path / "both").baseline["eval/reward_mean"]


def write_results(path, evaluations: dict, seed: int = 0, steps: int = 1, baseline: float = 0.0):
    """A sweep's layers.jsonl by hand: {layer: eval/reward_mean after `steps` steps}."""
    lines = [
        {"sweep": {"format": 1, "steps": steps, "num_layers": 6, "config": {"train": {"seed": seed}}}},
        {"baseline": {"eval/reward_mean": baseline}},
        *({"layer": layer, "eval": {"eval/reward_mean": value}} for layer, value in evaluations.items()),
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_two_sweeps_compare_by_spearmans_rho(tmp_path, capsys):
    # ranks 1 4 2 3 against 2 3 1 4: rho = 1 - 6 * 4 / (4 * 15) = 0.6
    a = write_results(tmp_path / "a" / RESULTS, {1: 0.2, 2: 0.5, 3: 0.3, 4: 0.4})
    b = write_results(tmp_path / "b" / RESULTS, {1: 0.3, 2: 0.4, 3: 0.2, 4: 0.5, 5: 0.9}, seed=1)
    assert main(["sweep-layers", "--compare", str(a), str(b.parent)]) == 0
    out = capsys.readouterr().out
    assert "over their 4 common layers (eval/reward_mean): +0.600" in out
    assert "(seed 0): best layer 2" in out and "(seed 1): best layer 4" in out


def test_gains_are_per_step_from_the_baseline(tmp_path):
    results = SweepResults.read(write_results(tmp_path / RESULTS, {1: 0.5, 2: 0.25}, steps=4, baseline=0.25))
    assert results.gains() == {1: 0.0625, 2: 0.0}


def test_a_line_cut_short_is_dropped_and_the_lines_before_it_kept(tmp_path):
    path = write_results(tmp_path / RESULTS, {1: 0.5, 2: 0.25})
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"layer": 3, "eval": {"eval/rew')  # a sweep killed while writing layer 3
    results = SweepResults.read(path, repair=True)
    assert sorted(results.rows) == [1, 2] and path.read_bytes() == whole


def test_a_folder_of_another_sweep_is_refused(toy, tmp_path, capsys):
    folder = tmp_path / "sweep"
    write_results(folder / RESULTS, {1: 0.5})
    before = (folder / RESULTS).read_bytes()
    _, err = sweep(toy, capsys, "--output_dir", folder, code=2)
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"hydrappo sweep-layers: --output_dir '{folder}' holds a sweep of another setting")
    assert "(--steps 1 there, 2 here; " in err
    assert (folder / RESULTS).read_bytes() == before


@pytest.mark.parametrize(
    "options, words",
    [
        (["--layers", "1:9"], "--layers '1:9' runs past the top: this model has 4 decoder layers (0..3)"),
        (["--layers", "0:3"], "starts at layer 0, which cannot train alone"),
        (["--layers", "three"], "--layers 'three' is not a band of layers"),
        (["--layers", "0.5:1.5"], "fractions lie in 0..1"),
        (["--window", "4"], "--window 4 is wider than the 3 candidate layers (1..3)"),
        (["--layers", "2:4", "--window", "3"], "--window 3 is wider than the 2 candidate layers (2..3)"),
        (["--eval_prompts", ""], "has no held-out evaluation, and the sweep ranks layers by held-out gain"),
        (["--steps", "0"], "--steps 0: give 1 or more steps per layer"),
        (["--steps", "21"], "--steps 21 is past the run's train.total_steps 20"),
    ],
)
def test_bad_input_is_refused_in_one_line_before_anything_is_written(toy, tmp_path, capsys, options, words):
    folder = tmp_path / "sweep"
    rc = main(["sweep-layers", str(toy / "config.yaml"), "--output_dir", str(folder), *options])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("hydrappo sweep-layers: ") and words in err, err
    assert not folder.exists()


def test_compare_without_a_config_takes_two_files(tmp_path, capsys):
    a = write_results(tmp_path / "a" / RESULTS, {1: 0.2})
    assert main(["sweep-layers", "--compare", str(a)]) == 2
    assert "give exactly two files" in capsys.readouterr().err
    assert main(["sweep-layers", "--compare", str(a), str(tmp_path / "missing.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err
