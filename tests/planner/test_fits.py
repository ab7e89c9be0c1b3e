"""`hydrappo memory MODEL --gpu 24`: the settings that fit, each with the options that select it
and its plan, beside TRL's GRPOTrainer + LoRA as TRL users run it (beta 0: no reference model,
gradient checkpointing on) and the classic four models."""

from dataclasses import replace

from hydrappo.cli import main
from hydrappo.planner.counts import load_model_config
from hydrappo.planner.fit import trl_grpo_lora, variants
from hydrappo.planner.plan import plan_memory
from hydrappo.planner.settings import GIB, TrainingSettings


def rows(out: str) -> dict[str, tuple[float, str]]:
    found = {}
    for line in out.splitlines():
        parts = line.rsplit(maxsplit=2)
        if len(parts) == 3 and parts[2] in ("yes", "no"):
            found[parts[0].strip()] = (float(parts[1]), parts[2])
    return found


def test_the_settings_that_fit_a_gpu_are_listed_with_their_options(capsys):
    assert main(["memory", "qwen2.5-1.5b", "--gpu", "12"]) == 0
    table = rows(capsys.readouterr().out)
    config, settings = load_model_config("qwen2.5-1.5b"), TrainingSettings()
    for label, variant in variants(settings):  # each row is the plan of the options it names
        peak = plan_memory(config, variant, "qwen2.5-1.5b").hydra.peak
        assert table[label][0] == round(peak / GIB, 2), label
    light = table["--no-reward-model"][0]
    assert (
        light < table["(as given)"][0]
        and table["--no-reward-model --lora-rank 16 --trunk-quantization 4bit"][0] < light
    )
    (trl,) = [label for label in table if label.startswith("TRL GRPOTrainer + LoRA r=16 (beta 0: no reference")]
    (classic,) = [label for label in table if label.startswith("classic")]
    assert table["(as given)"][0] < table[trl][0] < table[classic][0]


def test_trl_grpo_with_lora_is_the_policy_alone():
    config = load_model_config("smollm2-360m")
    lora = plan_memory(
        config, replace(TrainingSettings(), lora_rank=16, reward_model=False, gradient_checkpointing=True)
    )
    trl = {c.name: c.bytes for c in trl_grpo_lora(lora.classic).components}
    classic = {c.name: c.bytes for c in lora.classic.components}
    assert trl["reference model"] == trl["value model"] == trl["reward model"] == 0
    for name in ("LoRA adapters", "gradients", "activations"):  # policy + critic -> the policy
        assert trl[name] == classic[name] // 2 > 0
    assert (
        trl["policy weights"] == classic["policy weights"] and trl["full-vocab logits"] == classic["full-vocab logits"]
    )
