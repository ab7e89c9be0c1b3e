"""Models named by Hub id (ORG/NAME), resolved offline from a Hugging Face cache the test builds
in huggingface_hub's own layout: models--ORG--NAME/{blobs, refs/<branch>, snapshots/<commit>/...}.
No test reaches the network: socket connections and name look-ups raise and are recorded."""

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from hydrappo.cli import main
from hydrappo.config import ModelConfig
from hydrappo.rewards import ClassifierReward
from hydrappo.storage.models import ModelLoadError, load_model_and_tokenizer, resolve_model_source

from runs import FAST_ONE_STEP, FIXTURES, TINY

HUB_ID = "tiny-org/tiny-llama"
MAIN, V2 = "1" * 40, "2" * 40  # the commits refs/main and refs/v2 point at


def add_snapshot(cache: Path, repo_id: str, folder: Path, commit: str, refs: tuple[str, ...] = ("main",)) -> Path:
    """Put `folder`'s files into `cache` the way huggingface_hub stores a download: content in
    blobs/, the commit's tree as relative symlinks in snapshots/<commit>/, branch names in refs/."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for file in sorted(folder.iterdir()):
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)
    return snapshot


def tiny_pretrained(folder: Path, seed: int) -> Path:
    """The tiny example's Llama with weights drawn from `seed`, saved with its tokenizer."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY / "model"))
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(TINY / "model").save_pretrained(folder)
    return folder


@pytest.fixture
def hub_cache(tmp_path_factory, monkeypatch, no_network):
    """A cache holding HUB_ID at main (seed 0) and at branch v2 (seed 1), selected by HF_HUB_CACHE,
    with HF_HUB_OFFLINE=1. Returns (cache, {revision: snapshot folder})."""
    root = tmp_path_factory.mktemp("hf")
    cache = root / "hub"
    snapshots = {
        "main": add_snapshot(cache, HUB_ID, tiny_pretrained(root / "main", 0), MAIN),
        "v2": add_snapshot(cache, HUB_ID, tiny_pretrained(root / "v2", 1), V2, refs=("v2",)),
    }
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache, snapshots


def test_a_hub_id_resolves_to_its_cached_snapshot(hub_cache, no_network):
    cache, snapshots = hub_cache
    assert resolve_model_source(HUB_ID) == (snapshots["main"], None)
    assert resolve_model_source(HUB_ID, revision="v2") == (snapshots["v2"], None)
    assert resolve_model_source(HUB_ID, revision=V2) == (snapshots["v2"], None)  # a commit names its snapshot
    assert no_network == []


def test_hf_home_chooses_the_cache_too(hub_cache, monkeypatch):
    cache, snapshots = hub_cache
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(cache.parent))  # huggingface_hub's cache is $HF_HOME/hub
    assert resolve_model_source(HUB_ID) == (snapshots["main"], None)


def test_an_existing_local_folder_wins_over_a_hub_id(hub_cache, tmp_path, monkeypatch):
    local = tmp_path / HUB_ID
    tiny_pretrained(local, 5)
    monkeypatch.chdir(tmp_path)
    assert resolve_model_source(HUB_ID) == (Path(HUB_ID), None)


def test_a_cached_revision_loads_its_own_weights(hub_cache):
    cache, snapshots = hub_cache
    expected = AutoModelForCausalLM.from_pretrained(snapshots["v2"])
    model, tokenizer = load_model_and_tokenizer(ModelConfig(name_or_path=HUB_ID, revision="v2"))
    main_model, _ = load_model_and_tokenizer(ModelConfig(name_or_path=HUB_ID))
    for (name, param), (_, other) in zip(model.named_parameters(), expected.named_parameters()):
        assert torch.equal(param, other), name
    assert not torch.equal(model.lm_head.weight, main_model.lm_head.weight)  # main is another snapshot
    assert tokenizer.padding_side == "left" and tokenizer.pad_token is not None


def test_a_reward_model_hub_id(hub_cache, tmp_path):
    cache, _ = hub_cache
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(TINY / "model", num_labels=1)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(tmp_path / "rm")
    AutoTokenizer.from_pretrained(TINY / "model").save_pretrained(tmp_path / "rm")
    add_snapshot(cache, "tiny-org/tiny-rm", tmp_path / "rm", "3" * 40)
    scores = ClassifierReward("tiny-org/tiny-rm")(["w1 w2"], ["w1"], ["w2"])
    assert len(scores) == 1 and all(torch.isfinite(torch.as_tensor(scores)))


def _not_cached_message(err: str, revision: str, cache: Path, why: str, option: str = "model.name_or_path") -> None:
    assert "Traceback" not in err
    assert (
        f"{option}=tiny-org/missing (revision {revision}) is not in the Hugging Face cache {cache} and {why}, so it "
        "cannot be downloaded, and no local folder 'tiny-org/missing' exists either; fetch it on a machine with network"
        in err
    )
    version = f" --revision {revision}" if revision != "main" else ""
    assert f"hf download tiny-org/missing{version}" in err
    assert f"huggingface-cli download tiny-org/missing{version}" in err


@pytest.mark.parametrize("revision", [None, "v2"])
def test_an_uncached_id_offline_is_a_clear_error_before_anything_is_written(
    hub_cache, no_network, tmp_path, capsys, revision
):
    cache, _ = hub_cache
    out = tmp_path / "run"
    extra = ["--revision", revision] if revision else []
    code = main(
        [
            "train",
            str(TINY / "config.yaml"),
            "--name_or_path",
            "tiny-org/missing",
            *extra,
            "--output_dir",
            str(out),
            *FAST_ONE_STEP,
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    _not_cached_message(err, revision or "main", cache, "HF_HUB_OFFLINE is set")
    assert "unset HF_HUB_OFFLINE to download it now" in err
    assert no_network == []  # HF_HUB_OFFLINE: the cache is read, the Hub never asked
    assert not out.exists()


@pytest.mark.parametrize(
    "args, option",
    [
        (["--tokenizer_name_or_path", "tiny-org/missing"], "model.tokenizer_name_or_path"),
        (["--reward_fn", "", "--reward_model", "tiny-org/missing"], "reward.reward_model"),
    ],
)
def test_each_uncached_id_is_named_by_its_option(hub_cache, no_network, tmp_path, capsys, args, option):
    cache, _ = hub_cache
    out = tmp_path / "run"
    assert main(["train", str(TINY / "config.yaml"), *args, "--output_dir", str(out), *FAST_ONE_STEP]) == 2
    _not_cached_message(capsys.readouterr().err, "main", cache, "HF_HUB_OFFLINE is set", option)
    assert no_network == [] and not out.exists()


def test_exports_base_model_is_named_by_its_option_and_nothing_is_written(hub_cache, no_network, tmp_path, capsys):
    cache, _ = hub_cache
    checkpoint = FIXTURES / "legacy" / "ppo-checkpoint-2"
    out = tmp_path / "exported"
    out.mkdir()
    (out / "config.json").write_text("{}")  # an earlier export, which --overwrite would move aside
    for option in ("--base-model", "--tokenizer"):
        code = main(["export", str(checkpoint), "--out", str(out), option, "tiny-org/missing", "--overwrite"])
        assert code == 2
        _not_cached_message(capsys.readouterr().err, "main", cache, "HF_HUB_OFFLINE is set", option)
    assert [p.name for p in tmp_path.iterdir()] == ["exported"] and [p.name for p in out.iterdir()] == ["config.json"]


def test_a_hub_id_that_does_not_exist_is_named_by_its_option(hub_cache, monkeypatch):
    """Online, the Hub answers that no such repository exists (or the user may not read it)."""
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError

    from hydrappo.storage.hub import hub_snapshot

    def answer(*args, local_files_only=False, **kwargs):
        if local_files_only:
            raise LocalEntryNotFoundError("not cached")
        raise RepositoryNotFoundError.__new__(RepositoryNotFoundError)  # what a 404 raises (built without a response)

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", answer)
    with pytest.raises(ModelLoadError) as error:
        hub_snapshot("tiny-org/Tiny-Lama", option="reward.reward_model")
    assert str(error.value) == (
        "reward.reward_model=tiny-org/Tiny-Lama is no Hub model this machine may read (a typo, or a private or gated "
        "model), and no local folder of that name exists; correct the id, or `hf auth login` with an account that has access."
    )


def test_an_unreachable_hub_is_the_same_clear_error(hub_cache, no_network, monkeypatch):
    """HF_HUB_OFFLINE unset: the id is looked up online, the connection fails at once (the test
    refuses it), and the user reads the same message, not a connection traceback."""
    from huggingface_hub import constants

    cache, _ = hub_cache
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # read by huggingface_hub at import
    with pytest.raises(ModelLoadError) as error:
        resolve_model_source("tiny-org/missing")
    _not_cached_message(str(error.value), "main", cache, "the Hub could not be reached")
    assert no_network  # it did try, and the refusal became the message


@pytest.mark.parametrize(
    "option, value",
    [
        ("name_or_path", "org//name"),
        ("name_or_path", "org/na me"),
        ("tokenizer_name_or_path", "org/name/extra"),
        ("reward_model", "org/name.git"),
    ],
)
def test_a_malformed_hub_id_is_a_config_error(hub_cache, no_network, tmp_path, capsys, option, value):
    args = ["--reward_fn", "", "--reward_model", value] if option == "reward_model" else [f"--{option}", value]
    code = main(["train", str(TINY / "config.yaml"), *args, "--output_dir", str(tmp_path / "run"), *FAST_ONE_STEP])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    section = "reward" if option == "reward_model" else "model"
    assert f"{section}.{option}={value!r} is no local folder and no Hub model id" in err
    assert "correct the Hub id" in err
    assert no_network == [] and not (tmp_path / "run").exists()


def test_a_revision_needs_a_hub_id(tmp_path, capsys):
    code = main(
        ["train", str(TINY / "config.yaml"), "--revision", "v2", "--output_dir", str(tmp_path / "run"), *FAST_ONE_STEP]
    )
    err = capsys.readouterr().err
    assert code == 2 and "model.revision='v2' applies only to a Hub id" in err


@pytest.mark.slow
def test_train_export_generate_and_compare_from_a_hub_id(hub_cache, no_network, tmp_path, capsys):
    cache, snapshots = hub_cache
    out = tmp_path / "run"
    assert (
        main(
            [
                "train",
                str(TINY / "config.yaml"),
                "--name_or_path",
                HUB_ID,
                "--random_init",
                "false",
                "--revision",
                "v2",
                "--output_dir",
                str(out),
                *FAST_ONE_STEP,
            ]
        )
        == 0
    )
    checkpoint = out / "checkpoint-1"
    recorded = yaml.safe_load((checkpoint / "config.yaml").read_text())["model"]
    assert (recorded["name_or_path"], recorded["revision"]) == (HUB_ID, "v2")  # the id, not this machine's cache

    exported = tmp_path / "exported"
    assert main(["export", str(checkpoint), "--out", str(exported)]) == 0
    policy = AutoModelForCausalLM.from_pretrained(exported)
    base = AutoModelForCausalLM.from_pretrained(snapshots["v2"])
    # The frozen bottom is v2's, untouched; the top trained.
    assert torch.equal(policy.model.layers[0].self_attn.q_proj.weight, base.model.layers[0].self_attn.q_proj.weight)
    assert not torch.equal(policy.model.layers[-1].mlp.up_proj.weight, base.model.layers[-1].mlp.up_proj.weight)

    again = tmp_path / "exported-again"  # --base-model and --tokenizer take Hub ids too
    assert main(["export", str(checkpoint), "--out", str(again), "--base-model", HUB_ID, "--tokenizer", HUB_ID]) == 0
    reloaded = AutoModelForCausalLM.from_pretrained(again)
    for (name, param), (_, other) in zip(policy.named_parameters(), reloaded.named_parameters()):
        assert torch.equal(param, other), name

    capsys.readouterr()
    assert main(["generate", str(checkpoint), "--limit", "2", "--max_new_tokens", "4"]) == 0
    assert (
        main(
            [
                "compare",
                f"base={HUB_ID}",
                f"trained={checkpoint}",
                "--prompts",
                str(TINY / "prompts.jsonl"),
                "--limit",
                "2",
                "--max_new_tokens",
                "4",
                "--reward_fn",
                f"{TINY / 'reward.py'}:reward_fn",
            ]
        )
        == 0
    )
    assert "Traceback" not in capsys.readouterr().err
    assert no_network == []


@pytest.mark.parametrize("stage", ["sft", "reward"])
def test_the_sft_and_reward_stages_from_a_hub_id(hub_cache, no_network, tmp_path, stage):
    from runs import reward_config, write_sft_config

    cache, snapshots = hub_cache
    if stage == "sft":
        config = write_sft_config(tmp_path)
    else:
        reward_config(tmp_path)
        config = tmp_path / "reward.yaml"
    out = tmp_path / "out"
    assert (
        main(
            [
                stage,
                str(config),
                "--name_or_path",
                HUB_ID,
                "--random_init",
                "false",
                "--revision",
                "v2",
                "--output_dir",
                str(out),
                "--max_steps",
                "1",
                "--save_every",
                "1",
            ]
        )
        == 0
    )
    checkpoint = out / "checkpoint-1"
    recorded = yaml.safe_load((checkpoint / "config.yaml").read_text())["model"]
    assert (recorded["name_or_path"], recorded["revision"]) == (HUB_ID, "v2")
    base = AutoModelForCausalLM.from_pretrained(snapshots["v2"])
    if stage == "sft":  # the model it writes: v2's frozen bottom, untouched
        written = AutoModelForCausalLM.from_pretrained(out)
        assert torch.equal(written.model.layers[0].mlp.up_proj.weight, base.model.layers[0].mlp.up_proj.weight)
    else:  # the branch starts from v2's top layers and records the trunk it sits on
        state = json.loads((checkpoint / "trainer_state.json").read_text())
        assert state["base_model"]["name_or_path"] == HUB_ID
        from hydrappo.model import HydraModel
        from hydrappo.storage.reward_branch import trunk_fingerprint

        hydra = HydraModel(base, num_layers_unfrozen=2)
        assert state["base_model"]["trunk_fingerprint"] == trunk_fingerprint(hydra)  # the same weights, summed alike
    assert no_network == []
