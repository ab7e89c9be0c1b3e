"""train.load_best_model_at_end (train/stage.py BestEvaluation): the best held-out evaluation's trained weights,
kept as a copy and restored before the final checkpoint, for the reward and DPO stages."""

import pytest
import torch

from hydrappo.errors import UsageError
from hydrappo.storage.checkpoint import load_trainable_weights
from hydrappo.train.reward_model import RewardTrainer
from hydrappo.train.stage import BestEvaluation

from runs import reward_config


def test_the_best_is_a_copy_and_comes_back():
    module = torch.nn.Linear(2, 1)
    module.bias.requires_grad_(False)  # only what trains is kept
    best = BestEvaluation("accuracy")
    assert best.metric == "eval/accuracy" and best.greater
    values = [0.5, 0.7, 0.6]
    kept = None
    for step, value in enumerate(values, 1):
        with torch.no_grad():
            module.weight.fill_(step)
        best.offer(step, {"eval/accuracy": value, "eval/loss": 1 - value, "train/loss": 9.0}, module)
        if value == max(values):
            kept = module.weight.detach().clone()
    assert best.step == 2 and best.value == 0.7 and set(best.weights) == {"weight"}
    assert best.stats == {"eval/accuracy": 0.7, "eval/loss": pytest.approx(0.3)}
    with torch.no_grad():
        module.weight.fill_(-5.0)  # training went on: the kept copy does not move with it
    assert best.restore(module) and torch.equal(module.weight, kept)

    again = BestEvaluation("eval/accuracy")
    again.load_state_dict(best.state_dict())  # a resumed run keeps the best of the evaluations before it
    assert (again.step, again.value) == (2, 0.7) and torch.equal(again.weights["weight"], kept)
    other = BestEvaluation("eval/loss")  # resumed with another metric: the best starts anew
    other.load_state_dict(best.state_dict())
    assert other.step is None and not other.restore(module)


def test_a_loss_is_better_lower_unless_told_and_an_unknown_metric_is_named():
    module = torch.nn.Linear(1, 1)
    best = BestEvaluation("eval/loss")
    assert not best.greater and BestEvaluation("eval/loss", greater_is_better=True).greater
    best.offer(1, {"eval/loss": 0.4}, module)
    best.offer(2, {"eval/loss": 0.6}, module)
    assert best.step == 1
    with pytest.raises(UsageError, match=r"'eval/acc' is not among the held-out statistics \(eval/loss\)"):
        BestEvaluation("acc").offer(1, {"eval/loss": 0.4, "train/loss": 1.0}, module)


@pytest.mark.slow
def test_the_reward_stage_ends_with_its_best_evaluation(tmp_path):
    config = reward_config(
        tmp_path, dtype="float64", epochs=4, eval_every=1, learning_rate=3e-2, load_best_model_at_end=True
    )
    trainer = RewardTrainer(config, config_dir=tmp_path)
    history = trainer.train()
    curve = [(row["step"], row["eval/accuracy"]) for row in history if "eval/accuracy" in row]
    best_step, best_value = max(curve, key=lambda point: (point[1], -point[0]))
    assert trainer.best.step == best_step and trainer.best.value == best_value
    assert best_step != curve[-1][0], f"a curve whose best is not its end tests the restoring: {curve}"
    # the branch the run ends with, and writes, answers the held-out pairs as the best evaluation did
    assert trainer.evaluate()["eval/accuracy"] == pytest.approx(best_value)
    # and the final checkpoint holds them: read back over weights moved away
    with torch.no_grad():
        for p in trainer.branch.parameters():
            p.add_(1.0)
    load_trainable_weights(trainer.branch, trainer.checkpoint_path)
    for name, p in trainer.branch.named_parameters():
        if p.requires_grad:
            assert torch.equal(p.detach().cpu(), trainer.best.weights[name]), name


def test_keeping_the_best_needs_held_out_pairs(tmp_path):
    config = reward_config(tmp_path, load_best_model_at_end=True)
    config.data.eval_fraction = 0.0
    with pytest.raises(UsageError, match="this run holds out no pairs"):
        RewardTrainer(config, config_dir=tmp_path)
