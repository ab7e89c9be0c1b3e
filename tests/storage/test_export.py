"""Conversions: hydrappo checkpoint -> transformers model, trlX hydra checkpoint -> hydrappo checkpoint."""

import copy
import json
import os
import subprocess
import sys

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from hydrappo import HydraModel
from hydrappo.storage.checkpoint import (
    WEIGHTS_NAME,
    load_trainable_weights,
    save_checkpoint,
    trainable_state_dict,
    write_manifest,
)
from hydrappo.config import Config, parse_config
from hydrappo.storage.export import ExportError, export_checkpoint
from hydrappo.storage.trlx import convert_to_trlx, convert_trlx
from hydrappo.cli import main as cli_main
from hydrappo.model.heads import ValueHead
from hydrappo.train.ppo import PPOTrainer
from runs import ROOT, TINY
from tiny import FLOAT64_ATOL, tiny_model, tiny_tokenizer

# An exported or converted model computes what the hydra computes by another path (its own forward
# against the edited layer list, adapters merged against added): the models here are float64 and
# agree within FLOAT64_ATOL (tests/helpers/tiny.py says why).


def export_main(argv):
    return cli_main(["export", *argv])


def _load_plain(directory, capfd, dtype=torch.float64):
    """AutoModelForCausalLM.from_pretrained alone, with no missing/unexpected/mismatched keys and no
    load report (transformers prints one, to its own stderr handler, when keys do not match)."""
    capfd.readouterr()
    model, info = AutoModelForCausalLM.from_pretrained(str(directory), output_loading_info=True, dtype=dtype)
    assert info["missing_keys"] in (set(), []) and info["unexpected_keys"] in (set(), []), info
    assert not info.get("mismatched_keys"), info
    err = capfd.readouterr().err
    assert "LOAD REPORT" not in err and "MISSING" not in err and "UNEXPECTED" not in err, err
    return model.eval()


def test_the_load_check_catches_a_missing_key(tmp_path, capfd):
    from safetensors.torch import save_file

    tiny_model("llama", tie_word_embeddings=False).save_pretrained(tmp_path)
    weights = load_file(str(tmp_path / "model.safetensors"))
    del weights["lm_head.weight"]
    save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(AssertionError):
        _load_plain(tmp_path, capfd)


# One PPO step in float64 at a learning rate large enough to move every trained weight visibly.
ONE_FLOAT64_STEP = ["--no_progress_bar", "--total_steps", "1", "--batch_size", "8", "--mini_batch_size", "4"]
ONE_FLOAT64_STEP += ["--ppo_epochs", "1", "--learning_rate", "0.05", "--dtype", "float64"]


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory):
    """One step of the tiny example (random-init Llama, trained lm_head untied from the embeddings)."""
    out = tmp_path_factory.mktemp("ppo")
    config = parse_config(TINY / "config.yaml", ["--output_dir", str(out), *ONE_FLOAT64_STEP])
    trainer = PPOTrainer(config, config_dir=TINY)
    trainer.train()
    return trainer, out / "checkpoint-1"


@pytest.mark.slow
def test_ppo_checkpoint_exports_to_a_plain_model_with_the_policys_logits(ppo_run, tmp_path, capfd):
    trainer, checkpoint = ppo_run
    hydra = trainer.hydra
    out = tmp_path / "policy"
    export_checkpoint(checkpoint, out, value_head=tmp_path / "value_head.safetensors")

    model = _load_plain(out, capfd)
    assert {v.dtype for v in load_file(str(out / "model.safetensors")).values()} == {torch.float64}  # as trained
    assert model.config.tie_word_embeddings is False  # trained lm_head, untied
    assert not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    ids = torch.randint(4, 60, (3, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with torch.no_grad():
        expected = hydra.forward_hydra(ids, mask, return_logits=True)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
    real = mask.bool()
    assert expected.logits.dtype == logits.dtype == torch.float64
    assert torch.allclose(logits[real], expected.logits[real], atol=FLOAT64_ATOL, rtol=0)
    # the export is the TRAINED policy, not the reference
    assert not torch.allclose(expected.ref_logits[real], expected.logits[real], atol=1e-3)

    head = ValueHead(hydra.arch.hidden_size).double()
    head.load_state_dict(load_file(str(tmp_path / "value_head.safetensors")))
    for name, tensor in head.state_dict().items():
        assert torch.equal(tensor, hydra.value_head.state_dict()[name]), name
    assert json.loads((out / "hydrappo_export.json").read_text())["step"] == 1
    assert (out / "tokenizer.json").is_file()


def test_refuses_a_non_empty_output_directory(ppo_run, tmp_path, capsys):
    _, checkpoint = ppo_run
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert export_main([str(checkpoint), "--out", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    # an output_dir resolves to its newest checkpoint; --overwrite replaces; --dtype casts the
    # policy trained in float64 (the random-init base is still rebuilt in float64)
    assert export_main([str(checkpoint.parent), "--out", str(out), "--overwrite", "--dtype", "bfloat16"]) == 0
    assert not (out / "keep.txt").exists()
    written = load_file(str(out / "model.safetensors"))
    policy = dict(ppo_run[0].hydra.model.named_parameters())
    assert all(v.dtype == torch.bfloat16 for v in written.values())
    for name in ("model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight", "model.layers.3.mlp.up_proj.weight"):
        assert torch.equal(written[name], policy[name].detach().to(torch.bfloat16)), name


def _hydra_checkpoint(tmp_path, family, name_or_path, **hydra_kwargs):
    """A checkpoint written by saving a HydraModel whose trainable weights were perturbed."""
    base = tiny_model(family, seed=3)
    base_dir = tmp_path / "base"
    base.save_pretrained(base_dir)
    tiny_tokenizer().save_pretrained(base_dir)
    hydra = HydraModel(AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float64).eval(), 2, **hydra_kwargs)
    with torch.no_grad():
        for param in hydra.trainable_parameters():
            param.add_(torch.randn_like(param) * 0.05)
    config = Config()
    config.model.name_or_path = name_or_path
    config.model.num_layers_unfrozen = 2
    for key, value in hydra_kwargs.items():
        setattr(config.model, key, value)
    checkpoint = save_checkpoint(
        tmp_path / "run",
        7,
        weights=trainable_state_dict(hydra),
        training_state={},
        trainer_state={},
        config_yaml=yaml.safe_dump(config.to_dict()),
    )
    return hydra, checkpoint, base_dir


def test_gpt2_export_sharded_with_a_moved_base_model(tmp_path, capfd):
    hydra, checkpoint, base_dir = _hydra_checkpoint(tmp_path, "gpt2", "models/where-it-was", train_final_norm=True)
    out = tmp_path / "policy"
    with pytest.raises(ExportError, match="--base-model"):
        export_checkpoint(checkpoint, out)
    assert (
        export_main([str(checkpoint), "--out", str(out), "--base-model", str(base_dir), "--max-shard-size", "40KB"])
        == 0
    )
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(shards) > 1 and (out / "model.safetensors.index.json").is_file()
    model = _load_plain(out, capfd)
    assert model.config.tie_word_embeddings is True  # the head did not train: still tied
    ids = torch.randint(4, 96, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(
            model(ids).logits, hydra.forward_hydra(ids, return_logits=True).logits, atol=FLOAT64_ATOL, rtol=0
        )


def test_weights_that_do_not_fit_are_a_clear_error(tmp_path, capsys):
    _, checkpoint, base_dir = _hydra_checkpoint(tmp_path, "llama", str(tmp_path / "base"))
    data = yaml.safe_load((checkpoint / "config.yaml").read_text())
    data["model"]["num_layers_unfrozen"] = 3
    (checkpoint / "config.yaml").write_text(yaml.safe_dump(data))
    assert export_main([str(checkpoint), "--out", str(tmp_path / "x")]) == 2
    assert "config.yaml differs from what was written" in capsys.readouterr().err  # edited: its manifest says so
    write_manifest(checkpoint)  # edited on purpose
    assert export_main([str(checkpoint), "--out", str(tmp_path / "x")]) == 2
    assert "does not fit" in capsys.readouterr().err
    assert export_main([str(tmp_path / "nowhere"), "--out", str(tmp_path / "y")]) == 2


# --------------------------------------------------------------------------- trlX


def _top(model, family):
    """(decoder, name of its layer list, name of its final norm)."""
    return (model.transformer, "h", "ln_f") if family == "gpt2" else (model.model, "layers", "norm")


def _trlx_checkpoint(tmp_path, family, n=2, train_embeddings=False):
    """What trlX's AutoModelForCausalLMWithHydraValueHead.state_dict() holds after training:
    base_model.* = the trained policy, frozen_head.* = the original top, v_head.* = MLP head."""
    original = tiny_model(family, seed=5).double()
    policy = copy.deepcopy(original)
    torch.manual_seed(6)
    decoder, layers, norm = _top(policy, family)
    with torch.no_grad():
        for p in [*getattr(decoder, layers)[-n:].parameters(), *getattr(decoder, norm).parameters()]:
            p.add_(torch.randn_like(p) * 0.1)
        if train_embeddings:  # trlX leaves the embeddings (and so a tied head) trainable
            embeddings = policy.get_input_embeddings().weight
            embeddings.add_(torch.randn_like(embeddings) * 0.1)
    hidden = original.config.hidden_size
    v_head = torch.nn.Sequential(
        torch.nn.Linear(hidden, 2 * hidden), torch.nn.ReLU(), torch.nn.Linear(2 * hidden, 1)
    ).double()
    o_decoder = _top(original, family)[0]
    branch = torch.nn.Module()  # trlX's ModelBranch: deep copies of the original top
    branch.decoder_blocks = copy.deepcopy(getattr(o_decoder, layers)[-n:])
    branch.final_norm = copy.deepcopy(getattr(o_decoder, norm))
    branch.lm_head = copy.deepcopy(original.lm_head)
    state = {
        **policy.state_dict(prefix="base_model."),
        **v_head.state_dict(prefix="v_head."),
        **branch.state_dict(prefix="frozen_head."),
    }
    source = tmp_path / "trlx"
    source.mkdir()
    torch.save(state, source / "pytorch_model.bin")
    original.config.save_pretrained(source)
    tiny_tokenizer().save_pretrained(source)
    return original, policy, v_head, source


def _trlx_reference(original, policy, family, n=2):
    """trlX's reference pass: the policy's trunk, then the frozen original top, norm and head."""
    reference = copy.deepcopy(policy)
    decoder, layers, norm = _top(reference, family)
    o_decoder = _top(original, family)[0]
    for i in range(-n, 0):
        getattr(decoder, layers)[i] = copy.deepcopy(getattr(o_decoder, layers)[i])
    setattr(decoder, norm, copy.deepcopy(getattr(o_decoder, norm)))
    reference.lm_head = copy.deepcopy(original.lm_head)
    return reference


def _logprobs(logits, ids):
    return logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)


@pytest.mark.parametrize("family,train_embeddings", [("gpt2", False), ("llama", True)])
def test_trlx_hydra_checkpoint_converts_exactly(tmp_path, family, train_embeddings):
    original, policy, v_head, source = _trlx_checkpoint(tmp_path, family, train_embeddings=train_embeddings)
    out, base = tmp_path / "converted", tmp_path / "base"
    result = convert_trlx(source, out, write_base=base)
    assert result.num_layers_unfrozen == 2 and result.train_final_norm
    assert result.train_lm_head == train_embeddings  # a tied head that trained must be untied

    saved = yaml.safe_load((out / "config.yaml").read_text())["model"]
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float64).eval()
    assert model.config.tie_word_embeddings is not train_embeddings  # untied where the head trained, and said so
    hydra = HydraModel(
        model,
        saved["num_layers_unfrozen"],
        train_lm_head=saved["train_lm_head"],
        train_final_norm=saved["train_final_norm"],
    )
    load_trainable_weights(hydra, out)

    weights = load_file(str(out / WEIGHTS_NAME))
    for index in (0, 2):
        assert torch.equal(weights[f"value_head.mlp.{index}.weight"], v_head[index].weight)
        assert torch.equal(weights[f"value_head.mlp.{index}.bias"], v_head[index].bias)

    ids = torch.randint(4, 96, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out_h = hydra.forward_hydra(ids)
        plain = policy(ids, output_hidden_states=True)
        ref_logits = _trlx_reference(original, policy, family)(ids).logits
    assert not torch.allclose(plain.logits, ref_logits, atol=1e-3)
    assert out_h.logprobs.dtype == torch.float64
    assert torch.allclose(out_h.logprobs, _logprobs(plain.logits, ids), atol=FLOAT64_ATOL, rtol=0)
    assert torch.allclose(out_h.ref_logprobs, _logprobs(ref_logits, ids), atol=FLOAT64_ATOL, rtol=0)
    assert torch.allclose(out_h.values, v_head(plain.hidden_states[-1]).squeeze(-1), atol=FLOAT64_ATOL, rtol=0)


def test_trlx_without_frozen_head_infers_n_from_the_original(tmp_path):
    original, policy, v_head, source = _trlx_checkpoint(tmp_path, "llama", n=1)
    state = torch.load(source / "pytorch_model.bin", weights_only=True)
    torch.save({k: v for k, v in state.items() if not k.startswith("frozen_head.")}, source / "pytorch_model.bin")
    original_dir = tmp_path / "original"
    original.save_pretrained(original_dir)
    with pytest.raises(ExportError, match="--base-model"):
        convert_trlx(source, tmp_path / "a", write_base=tmp_path / "b")
    result = convert_trlx(source, tmp_path / "converted", base_model=original_dir)
    assert (result.num_layers_unfrozen, result.train_final_norm, result.train_lm_head) == (1, True, False)
    hydra = HydraModel(
        AutoModelForCausalLM.from_pretrained(original_dir, dtype=torch.float64).eval(), 1, train_final_norm=True
    )
    load_trainable_weights(hydra, tmp_path / "converted")
    ids = torch.randint(4, 96, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(
            hydra.forward_hydra(ids).logprobs, _logprobs(policy(ids).logits, ids), atol=FLOAT64_ATOL, rtol=0
        )


def test_not_a_trlx_checkpoint_is_exit_code_2(tmp_path, capsys):
    source = tmp_path / "plain"
    tiny_model("llama").save_pretrained(source)
    assert export_main(["trlx", str(source), "--out", str(tmp_path / "o"), "--write-base", str(tmp_path / "b")]) == 2
    assert "base_model" in capsys.readouterr().err
    assert not (tmp_path / "o").exists() and not (tmp_path / "b").exists()


@pytest.mark.slow
def test_help_of_every_entry_point(capsys):
    for argv in (["--help"], ["trlx", "--help"], ["to-trlx", "--help"], ["gguf", "--help"]):
        assert export_main(argv) == 0  # the CLI turns argparse's exit into the exit code
    out = capsys.readouterr().out
    assert "--max-shard-size" in out and "--value-head" in out and "--keep-adapter" in out
    assert "hydrappo export trlx" in out and "frozen_head" in out  # trlX -> hydrappo's and to-trlx's help
    # the command runs stand-alone, in a fresh interpreter
    help_of = [sys.executable, "-m", "hydrappo", "export", "trlx", "--help"]
    result = subprocess.run(help_of, capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0 and "--write-base" in result.stdout, result.stderr


def _lora_checkpoint(tmp_path, family="llama", targets=("q_proj", "v_proj", "down_proj")):
    """A float64 LoRA checkpoint (adapters on the top 2 layers, moved off zero) on a tiny base in tmp_path/base."""
    from peft import LoraConfig

    base = tiny_model(family, seed=4)
    base_dir = tmp_path / "base"
    base.save_pretrained(base_dir)
    tiny_tokenizer().save_pretrained(base_dir)
    hydra = HydraModel(
        AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float64).eval(),
        2,
        lora=LoraConfig(r=4, lora_alpha=8, target_modules=list(targets)),
    )
    with torch.no_grad():
        for param in hydra.trainable_parameters():
            param.add_(torch.randn_like(param) * 0.1)
    config = Config()
    config.model.name_or_path, config.model.dtype = str(base_dir), "float64"  # (a LoRA checkpoint holds no trunk)
    config.lora.lora_r, config.lora.lora_alpha = 4, 8
    config.lora.lora_target_modules = list(targets)
    config.model.reward_branch_path = str(base_dir)  # any existing folder: loading is stubbed where it is used
    checkpoint = save_checkpoint(
        tmp_path / "run",
        3,
        weights=trainable_state_dict(hydra),
        training_state={},
        trainer_state={},
        config_yaml=yaml.safe_dump(config.to_dict()),
    )
    return hydra, checkpoint, base_dir


def test_lora_checkpoint_exports_merged_and_reward_branch_separately(tmp_path, capfd, monkeypatch):
    hydra, checkpoint, base_dir = _lora_checkpoint(tmp_path)
    branch = hydra.new_reward_branch()
    monkeypatch.setattr("hydrappo.storage.export.load_reward_branch", lambda h, path: branch)

    out = tmp_path / "policy"
    export_checkpoint(checkpoint, out, reward_branch=tmp_path / "reward.safetensors")
    model = _load_plain(out, capfd)
    assert not any("lora" in name for name in model.state_dict())
    ids = torch.randint(4, 96, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(
            model(ids).logits, hydra.forward_hydra(ids, return_logits=True).logits, atol=FLOAT64_ATOL, rtol=0
        )
    saved = load_file(str(tmp_path / "reward.safetensors"))
    assert saved.keys() == branch.state_dict().keys()
    assert all(torch.equal(saved[k], v) for k, v in branch.state_dict().items())


def test_a_band_checkpoint_exports_to_a_plain_model_with_the_policys_logits(tmp_path, capfd):
    """A band (layers 1:3 of 4) trained in place: the plain model holds the trained band and the
    untouched layers around it, and computes the hydra's policy logits."""
    config = parse_config(
        TINY / "config.yaml",
        [
            "--output_dir",
            str(tmp_path / "run"),
            *ONE_FLOAT64_STEP,
            "--trainable_layers",
            "1:3",
            "--train_lm_head",
            "false",
        ],
    )
    trainer = PPOTrainer(config, config_dir=TINY)
    trainer.train()
    hydra, out = trainer.hydra, tmp_path / "policy"
    export_checkpoint(tmp_path / "run" / "checkpoint-1", out)
    model = _load_plain(out, capfd)
    info = json.loads((out / "hydrappo_export.json").read_text())
    assert info["trainable_layers"] == "1:3"
    ids = torch.randint(4, 60, (3, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with torch.no_grad():
        expected = hydra.forward_hydra(ids, mask, return_logits=True)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
    real = mask.bool()
    assert torch.allclose(logits[real], expected.logits[real], atol=FLOAT64_ATOL, rtol=0)
    assert not torch.allclose(expected.ref_logits[real], expected.logits[real], atol=1e-3)  # the trained policy
    original_1, exported_1 = hydra.ref_layers[0].state_dict(), model.model.layers[1].state_dict()
    assert any(not torch.equal(original_1[name], exported_1[name]) for name in original_1)  # layer 1 trained


# --------------------------------------------------------------------------- --keep-adapter


def test_keep_adapter_writes_a_peft_adapter_whose_logits_are_the_merged_exports(tmp_path, capfd):
    from peft import PeftModel

    hydra, checkpoint, base_dir = _lora_checkpoint(tmp_path)
    adapter = tmp_path / "adapter"
    assert export_main([str(tmp_path / "run"), "--out", str(adapter), "--keep-adapter"]) == 0
    assert "wrote the LoRA adapter" in capfd.readouterr().out
    names = {p.name for p in adapter.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "hydrappo_export.json"} <= names
    assert not names & {"config.json", "model.safetensors"}  # the adapter alone, no model
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == str(base_dir)
    assert json.loads((adapter / "hydrappo_export.json").read_text())["adapter"] is True
    export_checkpoint(checkpoint, tmp_path / "merged")
    merged = _load_plain(tmp_path / "merged", capfd)
    base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float64).eval()
    adapted = PeftModel.from_pretrained(base, str(adapter)).eval()
    ids = torch.randint(4, 96, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = adapted(input_ids=ids).logits
        with adapted.disable_adapter():
            base_logits = adapted(input_ids=ids).logits
        assert logits.dtype == torch.float64
        assert torch.allclose(logits, merged(ids).logits, atol=FLOAT64_ATOL, rtol=0)
        assert torch.allclose(logits, hydra.forward_hydra(ids, return_logits=True).logits, atol=FLOAT64_ATOL, rtol=0)
    assert not torch.allclose(logits, base_logits, atol=1e-3)  # the trained adapter, not the base model


def test_keep_adapter_without_lora_is_one_line_before_anything_is_written(tmp_path, capsys):
    _, checkpoint, _ = _hydra_checkpoint(tmp_path, "llama", str(tmp_path / "base"))
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    capsys.readouterr()  # (the fixture's progress bars)
    cases = [
        ([str(tmp_path / "adapter")], "trained without LoRA"),
        ([str(taken), "--overwrite"], "trained without LoRA"),  # refused before --overwrite moves anything
        ([str(tmp_path / "a.gguf")], "not a GGUF file"),
    ]
    for out, words in cases:
        assert export_main([str(checkpoint), "--keep-adapter", "--out", *out]) == 2
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base", "run", "taken"]
    assert [p.name for p in taken.iterdir()] == ["keep.txt"]


# --------------------------------------------------------------------------- hydrappo -> trlX


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_checkpoint_goes_to_trlx_and_back_to_the_same_weights(tmp_path, family, capsys):
    hydra, checkpoint, base_dir = _hydra_checkpoint(tmp_path, family, str(tmp_path / "base"), train_final_norm=True)
    trlx = tmp_path / "trlx"
    assert export_main(["to-trlx", str(tmp_path / "run"), "--out", str(trlx)]) == 0
    assert "num_layers_unfrozen=2" in capsys.readouterr().out
    state = torch.load(trlx / "pytorch_model.bin", weights_only=True)
    assert {key.split(".")[0] for key in state} == {"base_model", "v_head", "frozen_head"}
    policy = hydra.model.state_dict()
    assert all(torch.equal(state[f"base_model.{key}"], value) for key, value in policy.items())
    original = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float64)
    decoder, layers, norm = _top(original, family)
    branch = torch.nn.Module()  # trlX's frozen head: the original top
    branch.decoder_blocks, branch.final_norm = getattr(decoder, layers)[-2:], getattr(decoder, norm)
    branch.lm_head = original.lm_head
    frozen = branch.state_dict(prefix="frozen_head.")
    assert frozen.keys() == {key for key in state if key.startswith("frozen_head.")}
    assert all(torch.equal(state[key], value) for key, value in frozen.items())

    back = convert_trlx(trlx, tmp_path / "back", write_base=tmp_path / "back-base")
    assert (back.num_layers_unfrozen, back.train_final_norm, back.train_lm_head) == (2, True, False)
    before, after = load_file(str(checkpoint / WEIGHTS_NAME)), load_file(str(tmp_path / "back" / WEIGHTS_NAME))
    assert before.keys() == after.keys()
    assert all(torch.equal(before[key], after[key]) for key in before)  # exactly: the same dtype, the same bits
    base_before = load_file(str(base_dir / "model.safetensors"))
    base_after = load_file(str(tmp_path / "back-base" / "model.safetensors"))
    assert base_before.keys() == base_after.keys()  # the written base is the original model (rebuilt in float64)
    assert all(torch.equal(value.double(), base_after[key]) for key, value in base_before.items())


def test_a_lora_critic_free_checkpoint_goes_to_trlx_merged_with_a_new_value_head(tmp_path):
    hydra, checkpoint, base_dir = _lora_checkpoint(tmp_path)
    data = yaml.safe_load((checkpoint / "config.yaml").read_text())
    data["ppo"]["advantage_estimator"] = "grpo"  # a critic-free run: no value head
    (checkpoint / "config.yaml").write_text(yaml.safe_dump(data))
    weights = load_file(str(checkpoint / WEIGHTS_NAME))
    save_file({k: v for k, v in weights.items() if not k.startswith("value_head.")}, str(checkpoint / WEIGHTS_NAME))
    write_manifest(checkpoint)  # edited on purpose
    result = convert_to_trlx(checkpoint, tmp_path / "trlx")
    assert result.fresh_value_head and result.frozen_head and result.num_layers_unfrozen == 2
    state = torch.load(tmp_path / "trlx" / "pytorch_model.bin", weights_only=True)
    assert not any("lora" in key for key in state) and {"v_head.0.weight", "v_head.2.bias"} <= state.keys()
    original = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float64)
    for index in (0, 1):  # the reference's top: the base model's layers, the adapters off
        for key, value in original.model.layers[2 + index].state_dict().items():
            assert torch.equal(state[f"frozen_head.decoder_blocks.{index}.{key}"], value)
    ids = torch.randint(4, 96, (2, 10), generator=torch.Generator().manual_seed(0))
    policy = copy.deepcopy(original)  # base_model.*: the policy, adapters merged
    policy.load_state_dict({k.removeprefix("base_model."): v for k, v in state.items() if k.startswith("base_model.")})
    with torch.no_grad():
        expected = hydra.forward_hydra(ids, return_logits=True).logits
        assert torch.allclose(policy(ids).logits, expected, atol=FLOAT64_ATOL, rtol=0)


# --------------------------------------------------------------------------- the tools/ scripts


def _tool(name):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_tool(name, *argv, cwd):
    """`python tools/NAME.py ARGV...` in a fresh interpreter, as a user runs it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    command = [sys.executable, str(ROOT / "tools" / f"{name}.py"), *map(str, argv)]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


def test_the_conversion_scripts_hand_the_runner_what_hydrappo_export_does():
    """Each script's parser gives every argument the command's parser gives, with the same defaults."""
    from hydrappo.storage.export_command import export_parser

    cases = [
        ("export_checkpoint", "checkpoint", ["CKPT", "--out", "DIR"]),
        ("convert_trlx", "trlx", ["SRC", "--out", "DIR"]),
        ("convert_trlx", "to-trlx", ["SRC", "--out", "DIR", "--to", "trlx"]),
        ("gguf_to_safetensors", "gguf", ["SRC", "--out", "DIR"]),
    ]
    for script, conversion, argv in cases:
        ours = vars(_tool(script).parse_args(argv))
        theirs = vars(
            export_parser(conversion, "hydrappo export").parse_args([a for a in argv if a not in ("--to", "trlx")])
        )
        assert {key: ours.get(key) for key in theirs} == theirs, (script, conversion)


@pytest.mark.slow
def test_the_export_checkpoint_script_is_the_same_export(tmp_path, capsys):
    _, checkpoint, _ = _lora_checkpoint(tmp_path)
    done = _run_tool(
        "export_checkpoint", tmp_path / "run", "--out", tmp_path / "adapter", "--keep-adapter", cwd=tmp_path
    )
    assert done.returncode == 0 and "wrote the LoRA adapter" in done.stdout, done.stderr
    assert export_main([str(checkpoint), "--out", str(tmp_path / "cli"), "--keep-adapter"]) == 0
    script, cli = (load_file(str(tmp_path / d / "adapter_model.safetensors")) for d in ("adapter", "cli"))
    assert script.keys() == cli.keys() and all(torch.equal(script[k], cli[k]) for k in cli)
    tool = _tool("export_checkpoint")
    assert tool.main([str(checkpoint), "--out", str(tmp_path / "merged"), "--dtype", "float32"]) == 0
    assert {v.dtype for v in load_file(str(tmp_path / "merged" / "model.safetensors")).values()} == {torch.float32}
    capsys.readouterr()
    assert tool.main([str(checkpoint), "--out", str(tmp_path / "merged")]) == 2
    assert "export_checkpoint.py: --out" in capsys.readouterr().err


@pytest.mark.slow
def test_the_convert_trlx_script_goes_both_ways(tmp_path, capsys):
    _, checkpoint, _ = _hydra_checkpoint(tmp_path, "llama", str(tmp_path / "base"), train_final_norm=True)
    done = _run_tool("convert_trlx", tmp_path / "run", "--to", "trlx", "--out", tmp_path / "trlx", cwd=tmp_path)
    assert done.returncode == 0 and "num_layers_unfrozen=2" in done.stdout, done.stderr
    tool = _tool("convert_trlx")
    argv = [str(tmp_path / "trlx"), "--out", str(tmp_path / "back"), "--write-base", str(tmp_path / "back-base")]
    assert tool.main(argv) == 0
    before, after = load_file(str(checkpoint / WEIGHTS_NAME)), load_file(str(tmp_path / "back" / WEIGHTS_NAME))
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    with pytest.raises(SystemExit):
        tool.parse_args([str(tmp_path / "run"), "--to", "trlx", "--out", "x", "--write-base", "y"])
    assert "--write-base do not apply with --to trlx" in capsys.readouterr().err
