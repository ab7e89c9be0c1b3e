"""DPO on the hydra (train/dpo.py): it learns a preference rule held out by prompt, logs TRL's
names, writes a model folder, takes TRL's objects and names, trains a band or LoRA, and its band's
gradient is that of a plain transformers model with the same layers trainable (float64)."""

import copy
import json

import pytest
import torch
import torch.nn.functional as F
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from hydrappo import HydraModel
from hydrappo.cli import main as cli_main
from hydrappo.config import DPOConfig, parse_config
from hydrappo.train.dpo import DPOTrainer

from runs import TINY, write_dpo_config, write_pairs
from tiny import FLOAT64_ATOL

TRL_KEYS = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/accuracies",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dpo")
    trainer = DPOTrainer(parse_config(write_dpo_config(tmp), [], DPOConfig))
    return tmp, trainer, trainer.train()


@pytest.mark.slow
def test_dpo_learns_the_held_out_preference_and_logs_trls_names(trained):
    tmp, trainer, history = trained
    evals = [row for row in history if "eval/rewards/accuracies" in row]
    assert evals[0]["step"] == 0 and evals[0]["eval/rewards/margins"] == pytest.approx(
        0.0, abs=1e-6
    )  # policy = reference
    assert evals[-1]["eval/rewards/accuracies"] >= 0.9, evals[-1]
    assert evals[-1]["eval/rewards/margins"] > 0.5 and evals[-1]["eval/loss"] < 0.5
    # the held-out prompts are none of the training prompts
    assert not set(map(str, trainer.eval_pairs.prompts)) & set(map(str, trainer.train_pairs.prompts))
    rows = [json.loads(line) for line in (tmp / "dpo" / "metrics.jsonl").read_text().splitlines()]
    for key in (*TRL_KEYS, "train/loss", "train/grad_norm"):
        assert all(key in row for row in rows if row["step"] > 0), key
    assert all(f"eval/{key}" in rows[-1] for key in TRL_KEYS)
    # The chosen answers' log-probs rise against the rejected ones'.
    assert rows[-1]["logps/chosen"] - rows[-1]["logps/rejected"] > rows[1]["logps/chosen"] - rows[1]["logps/rejected"]


@pytest.mark.slow
def test_the_written_model_is_the_trained_policy(trained):
    tmp, trainer, _ = trained
    model = AutoModelForCausalLM.from_pretrained(tmp / "dpo").to(torch.float32)
    ids = torch.tensor([trainer.train_pairs.prompt_ids[0] + trainer.train_pairs.chosen_ids[0]])
    with torch.no_grad():
        expected = trainer.hydra.model(ids).logits
    torch.testing.assert_close(model(ids).logits, expected, atol=1e-5, rtol=1e-5)
    assert (tmp / "dpo" / "dpo_config.yaml").is_file()


def plain_logps(model, prompt: list[int], answer: list[int]) -> torch.Tensor:
    """The summed log-prob of `answer` after `prompt` from the model's own full logits."""
    ids = torch.tensor([prompt + answer])
    logprobs = F.log_softmax(model(ids).logits[0, len(prompt) - 1 : -1], dim=-1)
    return logprobs.gather(-1, torch.tensor(answer)[:, None]).sum()


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_the_bands_gradient_equals_a_plain_models_in_float64(tmp_path, loss_type):
    tokenizer = AutoTokenizer.from_pretrained(TINY / "model")
    torch.manual_seed(0)
    from transformers import AutoConfig

    base = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY / "model")).double()
    hydra = HydraModel(copy.deepcopy(base), trainable_layers=(1, 3), value_head=False)
    path = write_dpo_config(tmp_path, {"loss_type": loss_type}, {"trainable_layers": "1:3", "train_lm_head": False})
    trainer = DPOTrainer(parse_config(path, [], DPOConfig), hydra=hydra, tokenizer=tokenizer)
    pairs, index = trainer.train_pairs, [0, 1, 2, 3]
    loss, _ = trainer.objective(trainer.pair_logps(pairs, index, "train"))
    loss.backward()

    plain, reference = copy.deepcopy(base), copy.deepcopy(base).requires_grad_(False)
    plain.requires_grad_(False)
    band = [plain.model.layers[i] for i in (1, 2)]
    for layer in band:
        layer.requires_grad_(True)
    beta, terms = 0.1, []
    for i in index:
        prompt, chosen, rejected = pairs.prompt_ids[i], pairs.chosen_ids[i], pairs.rejected_ids[i]
        gap = plain_logps(plain, prompt, chosen) - plain_logps(plain, prompt, rejected)
        ref_gap = plain_logps(reference, prompt, chosen) - plain_logps(reference, prompt, rejected)
        if loss_type == "ipo":  # length-averaged log-probs, as TRL's trainer computes IPO
            gap = plain_logps(plain, prompt, chosen) / len(chosen) - plain_logps(plain, prompt, rejected) / len(
                rejected
            )
            ref_gap = plain_logps(reference, prompt, chosen) / len(chosen) - plain_logps(
                reference, prompt, rejected
            ) / len(rejected)
            terms.append((gap - ref_gap - 1 / (2 * beta)) ** 2)
        else:
            terms.append(-F.logsigmoid(beta * (gap - ref_gap)))
    expected_loss = torch.stack(terms).mean()
    expected_loss.backward()
    assert loss.item() == pytest.approx(expected_loss.item(), abs=FLOAT64_ATOL)
    trained_layers = [hydra.model.model.layers[i] for i in (1, 2)]
    compared = 0
    for ours, theirs in zip(trained_layers, band):
        for (name, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters()):
            assert a.grad is not None, name
            torch.testing.assert_close(a.grad, b.grad, atol=1e-9, rtol=1e-7)
            compared += 1
    assert compared > 0
    # nothing outside the band trains
    assert all(p.grad is None for p in hydra.model.model.layers[0].parameters())


@pytest.mark.slow
def test_the_command_runs_a_band_with_lora_and_trls_names(tmp_path, capsys):
    path = write_dpo_config(tmp_path, {"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, 0.2]})
    out = tmp_path / "lora"
    code = cli_main(
        [
            "dpo",
            str(path),
            "--output_dir",
            str(out),
            "--lora_r",
            "4",
            "--train_lm_head",
            "false",
            "--trainable_layers",
            "1:3",
            "--max_steps",
            "3",
            "--per_device_train_batch_size",  # TRL's name of train.batch_size
            "8",
            "--learning_rate",
            "1e-3",
        ]
    )
    assert code == 0, capsys.readouterr().err
    assert "held-out accuracy" in capsys.readouterr().out
    assert (out / "adapter_config.json").is_file()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 3 and "loss/sft" in rows[-1] and "loss/sigmoid" in rows[-1]


def test_trls_objects_and_names(tmp_path):
    write_pairs(tmp_path / "pairs.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "pairs.jsonl").read_text().splitlines()]
    from datasets import Dataset

    trainer = DPOTrainer(
        model=str(TINY / "model"),
        train_dataset=Dataset.from_list(rows[:40]),
        eval_dataset=rows[40:50],
        processing_class=AutoTokenizer.from_pretrained(TINY / "model"),
        args={
            "random_init": True,
            "num_layers_unfrozen": 1,
            "output_dir": str(tmp_path / "out"),
            "num_train_epochs": 2,  # TRL's names, flat as DPOConfig takes them
            "per_device_train_batch_size": 8,
            "beta": 0.2,
            "loss_type": "hinge",
            "max_length": 20,
            "progress_bar": False,
        },
    )
    assert trainer.config.train.epochs == 2 and trainer.config.train.batch_size == 8
    assert trainer.config.dpo.loss_types == ("hinge",) and trainer.config.data.max_length == 20
    assert trainer.total_steps == 10 and len(trainer.eval_pairs) == 10
    assert all(len(p) + len(c) <= 20 for p, c in zip(trainer.train_pairs.prompt_ids, trainer.train_pairs.chosen_ids))


@pytest.mark.parametrize(
    "options, message",
    [
        ({"dpo": {"loss_type": "kto"}}, "dpo.loss_type"),
        ({"dpo": {"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0]}}, "one weight per loss_type"),
        ({"dpo": {"loss_type": "hinge", "label_smoothing": 0.1}}, "label_smoothing"),
        ({"dpo": {"label_smoothing": 0.5}}, "label_smoothing"),
        ({"train": {"gradient_accumulation_steps": 2}}, "per_device_train_batch_size x gradient_accumulation_steps"),
    ],
)
def test_options_that_cannot_work_are_refused_with_their_fix(tmp_path, capsys, options, message):
    path = write_dpo_config(tmp_path)
    data = yaml.safe_load(path.read_text())
    for section, values in options.items():
        data[section].update(values)
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "never"
    assert cli_main(["dpo", str(path), "--output_dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not out.exists()  # nothing written


def test_the_reward_stage_takes_trls_epoch_name(tmp_path):
    from hydrappo.config import RewardConfig

    write_pairs(tmp_path / "pairs.jsonl")
    config = parse_config(
        None,
        [],
        RewardConfig,
        data={"train_file": str(tmp_path / "pairs.jsonl"), "num_train_epochs": 2, "per_device_eval_batch_size": 4},
    )
    assert config.train.epochs == 2 and config.train.eval_batch_size == 4
