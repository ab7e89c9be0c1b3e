"""Bad input, as a user types it: every case goes through `hydrappo.cli.main` in this process
(one subprocess: kill -9 during a checkpoint write) and must give the documented exit code, a
message that names the offending option or file, no traceback, and leave every file that was
there before unchanged (usage errors write nothing at all)."""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from hydrappo.cli import main
from hydrappo.storage.atomic import host_name
from hydrappo.storage.checkpoint import MANIFEST_NAME, WEIGHTS_NAME, checkpoint_dirs
from hydrappo.storage.rundir import LOCK_NAME

from runs import FAST, FIXTURES, ROOT, TINY

CONFIG = str(TINY / "config.yaml")
# One short PPO step per call: 8 rollouts of 4 tokens, one epoch.

REWARDS = textwrap.dedent(
    """
    import math, os, signal, time
    from pathlib import Path

    Path(__file__).with_name("imported.log").open("a").write("imported\\n")  # proves the file ran

    def good(samples, prompts, outputs, **kwargs):
        return [sum(w.startswith("g") for w in o.split()) / max(1, len(o.split())) for o in outputs]

    def raises(samples, prompts, outputs, **kwargs):
        return [len(o) / 0 for o in outputs]

    def short(samples, prompts, outputs, **kwargs):
        return [0.0]

    def nan(samples, prompts, outputs, **kwargs):
        return [0.0] * (len(outputs) - 1) + [math.nan]

    def words(samples, prompts, outputs, **kwargs):
        return ["high" for _ in outputs]

    def hangs(samples, prompts, outputs, **kwargs):
        time.sleep(3)
        return [0.0] * len(outputs)

    SENT = []

    def _signal(outputs, signum, times):
        if not SENT:
            SENT.append(signum)
            for _ in range(times):
                os.kill(os.getpid(), signum)
                time.sleep(0.05)
        return [0.0] * len(outputs)

    def sigint(samples, prompts, outputs, **kwargs):
        return _signal(outputs, signal.SIGINT, 1)

    def sigterm(samples, prompts, outputs, **kwargs):
        return _signal(outputs, signal.SIGTERM, 1)

    def sigint_twice(samples, prompts, outputs, **kwargs):
        return _signal(outputs, signal.SIGINT, 2)
    """
)


# --------------------------------------------------------------------------- the workspace
@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """Files a user might have: reward functions, prompts, broken files, and one PPO run of
    two steps (checkpoint-1, checkpoint-2) scored by rewards.py:good."""
    root = tmp_path_factory.mktemp("bad_inputs")
    (root / "rewards.py").write_text(REWARDS)
    (root / "syntax.py").write_text("def good(samples, prompts, outputs:\n    return 1\n")
    (root / "a_file.txt").write_text("not a folder\n")
    (root / "latin1.jsonl").write_bytes('{"prompt": "caf\xe9"}\n'.encode("latin-1"))
    (root / "no_column.jsonl").write_text('{"text": "n1 n2"}\n')
    (root / "empty.jsonl").write_text("")
    (root / "broken.jsonl").write_text('{"prompt": "n1 n2"}\n{"prompt": "n3\n')
    (root / "pairs.jsonl").write_text('{"prompt": "n1", "chosen": "g1", "rejected": "n2"}\n' * 4)
    (root / "sft.jsonl").write_text('{"prompt": "n1", "response": "g1"}\n' * 4)
    bad_model = root / "bad_model"
    shutil.copytree(TINY / "model", bad_model)
    (bad_model / "config.json").write_text('{"model_type": "llama", "hidden_size": ')
    run = root / "run"
    assert (
        main(
            [
                "train",
                CONFIG,
                "--output_dir",
                str(run),
                "--total_steps",
                "2",
                "--reward_fn",
                f"{root / 'rewards.py'}:good",
                *FAST,
            ]
        )
        == 0
    )
    assert [p.name for p in checkpoint_dirs(run)] == ["checkpoint-1", "checkpoint-2"]
    (root / "imported.log").unlink()
    return root


def snapshot(*roots: Path) -> dict:
    files = {}
    for root in roots:
        for path in sorted(Path(root).rglob("*")):
            # rewards.py's own log of its imports; the run lock, which names whichever run claimed the folder last
            if path.is_file() and path.name not in ("imported.log", LOCK_NAME):
                files[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return files


def cli(argv, code, *names, capsys, caplog, watch, new_files=False, env=None) -> str:
    """Run `hydrappo ARGV`; check the exit code, that stderr names `names`, that no traceback
    was printed or logged, and that every file under `watch` is unchanged (and, unless
    `new_files`, that none appeared). Returns stderr and the log."""
    before = snapshot(*watch, TINY)
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    logged = caplog.text
    caplog.clear()
    assert rc == code, f"exit {rc}, expected {code}\n{err}\n{logged}"
    for name in names:
        assert str(name) in err, f"{name!r} not in the message:\n{err}"
    assert "Traceback" not in err + out + logged
    after = snapshot(*watch, TINY)
    changed = [path for path, digest in before.items() if after.get(path) != digest]
    assert not changed, f"changed or removed: {changed}"
    if not new_files:
        assert after.keys() == before.keys(), f"new files: {sorted(after.keys() - before.keys())}"
    return err + logged


# --------------------------------------------------------------------------- option values and combinations
def _ws(ws, text):
    return str(text).replace("WS", str(ws))


TRAIN_OPTION_CASES = [
    # (overrides, words the message must hold)
    (["--mini_batch_size", "-8"], ["ppo.mini_batch_size=-8", ">= 1"]),
    (["--mini_batch_size", "0"], ["ppo.mini_batch_size=0"]),
    (["--ppo_epochs", "0"], ["ppo.ppo_epochs=0"]),
    (["--batch_size", "0"], ["ppo.batch_size=0"]),
    (["--temperature", "0"], ["generation.temperature=0.0", "> 0"]),
    (["--top_p", "0"], ["generation.top_p=0.0", "(0, 1]"]),
    (["--top_p", "1.5"], ["generation.top_p=1.5"]),
    (["--top_k", "-1"], ["generation.top_k=-1"]),
    (["--learning_rate", "-1e-4"], ["ppo.learning_rate=-0.0001", "> 0"]),
    (["--cliprange", "-0.2"], ["ppo.cliprange=-0.2"]),
    (["--cliprange", "nan"], ["ppo.cliprange=nan"]),
    (["--seed", "-1"], ["train.seed=-1"]),
    (["--save_every", "-1"], ["train.save_every=-1"]),
    (["--generation_batch_size", "0"], ["generation.generation_batch_size=0"]),
    (["--gradient_accumulation_steps", "0"], ["ppo.gradient_accumulation_steps=0"]),
    (["--total_steps", "0"], ["train.total_steps=0"]),
    (["--keep_last", "0"], ["train.keep_last=0"]),
    (["--warmup_steps", "-1"], ["ppo.warmup_steps=-1"]),
    (["--gamma", "1.5"], ["ppo.gamma=1.5", "[0, 1]"]),
    (["--lam", "-0.1"], ["ppo.lam=-0.1"]),
    (["--adam_beta2", "1.0"], ["ppo.adam_beta2=1.0", "[0, 1)"]),
    (["--max_grad_norm", "-1"], ["ppo.max_grad_norm=-1.0"]),
    (["--dual_clip", "0.5"], ["ppo.dual_clip=0.5", "> 1"]),
    (["--init_kl_coef", "-0.1"], ["ppo.init_kl_coef=-0.1"]),
    (["--max_prompt_length", "0"], ["data.max_prompt_length=0"]),
    (["--num_layers_unfrozen", "-5"], ["model.num_layers_unfrozen=-5", ">= -1"]),
    (["--kl_controller", "pid"], ["ppo.kl_controller='pid'", "adaptive, fixed"]),
    (["--lr_scheduler", "step"], ["ppo.lr_scheduler='step'", "constant, linear, cosine"]),
    (["--mixed_precision", "fp8"], ["train.mixed_precision='fp8'"]),
    (["--dtype", "float8"], ["model.dtype='float8'"]),
    (["--device", "gpu"], ["train.device='gpu'"]),
    (["--advantage_estimator", "ppo2"], ["ppo.advantage_estimator='ppo2'", "gae, grpo"]),
    (
        ["--batch_size", "10", "--mini_batch_size", "4"],
        ["ppo.mini_batch_size=4", "multiple of mini_batch_size", "e.g. 5"],
    ),
    (["--mini_batch_size", "8", "--gradient_accumulation_steps", "3"], ["ppo.gradient_accumulation_steps=3"]),
    (["--samples_per_prompt", "3"], ["ppo.batch_size=32", "samples_per_prompt (3)"]),
    (["--advantage_estimator", "grpo"], ["ppo.advantage_estimator='grpo'", "samples_per_prompt >= 2"]),
    (["--min_new_tokens", "20"], ["generation.min_new_tokens=20", "max_new_tokens (8)"]),
    (["--kl_target", "3"], ["ppo.kl_target=3.0", "kl_controller: adaptive"]),
    (["--lora_dropout", "0.1"], ["lora.lora_dropout=0.1"]),
    (["--lora_r", "4"], ["model.train_lm_head=True", "LoRA"]),
    (["--lora_init_adapter", "WS/run"], ["lora.lora_init_adapter", "lora_r"]),
    (["--system_prompt", "be kind"], ["data.system_prompt='be kind'", "apply_chat_template"]),
    (["--score_normalization", "ref"], ["reward.score_normalization='ref'", "score_ref_mean"]),
    (["--score_ref_mean", "0.5"], ["reward.score_ref_mean=0.5", "score_normalization: ref"]),
    (["--score_ref_std", "0"], ["reward.score_ref_std=0.0"]),
    (["--use_reward_branch", "true"], ["reward.use_reward_branch=True needs model.reward_branch_path"]),
    (["--reward_weights", "1", "2"], ["reward.reward_weights=[1.0, 2.0] has 2 weight(s) for 1 reward source(s)"]),
    (["--reward_fn", ""], ["no reward source is set"]),
    (["--reward_fn", "reward_without_colon"], ["reward.reward_fn='reward_without_colon'"]),
    (["--reward_fn", "missing.py:fn"], ["reward.reward_fn='missing.py:fn'", "no such file"]),
    (["--timeout_s", "0"], ["reward.timeout_s=0.0"]),
    (["--prompts", "missing.jsonl"], ["data.prompts='missing.jsonl'", "no such file"]),
    (["--name_or_path", "/no/such/model"], ["model.name_or_path='/no/such/model'"]),
    (["--tokenizer_name_or_path", "WS/nothing_here"], ["model.tokenizer_name_or_path"]),
    (["--output_dir", "WS/a_file.txt"], ["train.output_dir", "a_file.txt", "is a file"]),
    (["--output_dir", "WS/a_file.txt/run"], ["train.output_dir", "no folder can be made below it"]),
    (["--batch_size", "abc"], ["--batch_size", "invalid int value: 'abc'"]),
    (["--batch_size"], ["--batch_size", "expected one argument"]),
    (["--learning-rat", "1e-4"], ["--learning-rat", "Did you mean --learning_rate?"]),
    (
        ["--temperature", "0", "--top_p", "0", "--seed", "-3"],
        ["3 problems in the config", "generation.temperature", "generation.top_p", "train.seed"],
    ),
    # a quantized or sharded trunk, the optimizer, the process group
    (["--trunk_quantization", "int4"], ["model.trunk_quantization='int4'", "none, int8, 4bit"]),
    (["--optimizer", "sgd"], ["ppo.optimizer='sgd'", "adamw, adamw8bit"]),
    (
        ["--trunk_quantization", "int8", "--num_layers_unfrozen", "-1"],
        ["model.trunk_quantization='int8'", "num_layers_unfrozen=-1 trains every layer"],
    ),
    (
        ["--trunk_quantization", "4bit", "--lora_r", "4", "--lora_layers", "all", "--train_lm_head", "false"],
        ["model.trunk_quantization='4bit'", "lora.lora_layers='all'", "lora_layers: top"],
    ),
    (["--fsdp_trunk", "--num_layers_unfrozen", "-1"], ["train.fsdp_trunk=True", "num_layers_unfrozen=-1"]),
    (["--fsdp_trunk", "--trunk_quantization", "int8"], ["train.fsdp_trunk=True", "choose one"]),
    (["--dist_timeout_s", "0"], ["train.dist_timeout_s=0.0", "> 0"]),
    (["--samples_per_prompt", "0"], ["generation.samples_per_prompt=0", ">= 1"]),
]


@pytest.mark.parametrize(
    "overrides, words", TRAIN_OPTION_CASES, ids=[" ".join(c[0]) or "empty" for c in TRAIN_OPTION_CASES]
)
def test_train_option_errors_name_the_option_before_anything_loads(ws, overrides, words, capsys, caplog, tmp_path):
    overrides = [_ws(ws, value) for value in overrides]
    cli(
        ["train", CONFIG, "--output_dir", tmp_path / "out", *overrides],
        2,
        *[_ws(ws, w) for w in words],
        capsys=capsys,
        caplog=caplog,
        watch=[ws, tmp_path],
    )
    assert not (tmp_path / "out").exists()


def test_a_batch_the_launched_processes_cannot_share_is_refused_before_anything_loads(
    ws, capsys, caplog, tmp_path, monkeypatch
):
    monkeypatch.setenv("WORLD_SIZE", "3")  # as torchrun sets it; process 0 of 3
    cli(
        ["train", CONFIG, "--output_dir", tmp_path / "out", "--batch_size", "8", "--mini_batch_size", "4"],
        2,
        "hydrappo train (process 0 of 3)",
        "2 problems in the config",
        "ppo.batch_size=8",
        "3 processes of this launch (WORLD_SIZE) cannot share",
        "ppo.mini_batch_size=4",
        "multiple of 3",
        capsys=capsys,
        caplog=caplog,
        watch=[ws, tmp_path],
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "overrides, option",
    [
        (["--trunk_quantization", "int8"], "model.trunk_quantization='int8'"),
        (["--optimizer", "adamw8bit"], "ppo.optimizer='adamw8bit'"),
    ],
)
def test_quantization_without_bitsandbytes_says_how_to_install_it(
    ws, overrides, option, capsys, caplog, tmp_path, monkeypatch
):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # importlib.util.find_spec then finds nothing
    cli(
        ["train", CONFIG, "--output_dir", tmp_path / "out", *overrides],
        2,
        option,
        "needs bitsandbytes",
        "pip install 'hydrappo[quant]'",
        capsys=capsys,
        caplog=caplog,
        watch=[ws, tmp_path],
    )


YAML_CASES = [
    # (file name, content or None for the case, words, exit code)
    ("missing.yaml", None, ["config file", "missing.yaml", "does not exist"]),
    ("folder.yaml", "FOLDER", ["config file", "is a folder"]),
    ("syntax.yaml", "ppo:\n  batch_size: [8\n", ["not valid YAML", "syntax.yaml"]),
    ("latin1.yaml", b"data:\n  system_prompt: caf\xe9\n", ["not UTF-8", "latin1.yaml"]),
    ("list.yaml", "- ppo\n- train\n", ["top level must be a mapping"]),
    ("section.yaml", "ppo: [1, 2]\n", ["section 'ppo' must be a mapping"]),
    ("unknown_section.yaml", "trainer:\n  steps: 3\n", ["unknown section 'trainer'", "valid sections: model"]),
    (
        "unknown_key.yaml",
        "ppo:\n  learning_rat: 1.0\n",
        ["unknown key 'learning_rat'", "Did you mean 'learning_rate'?"],
    ),
    ("word.yaml", "ppo:\n  batch_size: eight\n", ["batch_size='eight'", "whole number"]),
    ("bool.yaml", "ppo:\n  batch_size: true\n", ["batch_size=True", "whole number"]),
    ("float.yaml", "ppo:\n  batch_size: 8.5\n", ["batch_size=8.5", "whole number"]),
    ("not_list.yaml", "generation:\n  stop_strings: '###'\n", ["stop_strings='###'", "must be a list"]),
    ("bad_bool.yaml", "train:\n  progress_bar: maybe\n", ["progress_bar='maybe'", "true/false"]),
]


@pytest.mark.parametrize("name, content, words", YAML_CASES, ids=[c[0] for c in YAML_CASES])
def test_config_file_errors(ws, name, content, words, capsys, caplog, tmp_path):
    path = tmp_path / name
    if content == "FOLDER":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    cli(
        ["train", path, "--output_dir", tmp_path / "out"], 2, *words, capsys=capsys, caplog=caplog, watch=[ws, tmp_path]
    )


def stage_config(tmp_path: Path, ws: Path, kind: str, **sections) -> Path:
    data = {"train_file": str(ws / ("pairs.jsonl" if kind == "reward" else "sft.jsonl"))}
    config = {
        "model": {"name_or_path": str(TINY / "model"), "random_init": True, "num_layers_unfrozen": 2},
        "data": data,
        "train": {"output_dir": str(tmp_path / kind), "progress_bar": False, "max_steps": 1},
    }
    for section, values in sections.items():
        config.setdefault(section, {}).update(values)
    path = tmp_path / f"{kind}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


STAGE_CASES = [
    ("reward", {"train": {"epochs": 0, "max_steps": 0}}, ["train.epochs=0", "max_steps are both 0"]),
    ("reward", {"data": {"eval_fraction": 1.5}}, ["data.eval_fraction=1.5", "[0, 1)"]),
    ("reward", {"data": {"train_file": None}}, ["data.train_file=None", "is required"]),
    ("reward", {"data": {"train_file": "nope/pairs.jsonl"}}, ["data.train_file='nope/pairs.jsonl'"]),
    ("reward", {"model": {"num_layers_unfrozen": -1}}, ["model.num_layers_unfrozen=-1", "frozen trunk"]),
    ("reward", {"train": {"batch_size": 0}}, ["train.batch_size=0"]),
    ("reward", {"data": {"chosen_column": ""}}, ["data.chosen_column=''"]),
    ("sft", {"model": {"reward_branch_path": "WS/run"}}, ["model.reward_branch_path", "no use in sft"]),
    ("sft", {"train": {"learning_rate": 0}}, ["train.learning_rate=0.0"]),
    ("sft", {"data": {"max_response_length": 0}}, ["data.max_response_length=0"]),
    ("sft", {"model": {"num_layers_unfrozen": 0}}, ["model.num_layers_unfrozen=0", "nothing to train"]),
]


@pytest.mark.parametrize("kind, sections, words", STAGE_CASES, ids=[f"{c[0]}-{json.dumps(c[1])}" for c in STAGE_CASES])
def test_reward_and_sft_option_errors(ws, kind, sections, words, capsys, caplog, tmp_path):
    sections = json.loads(_ws(ws, json.dumps(sections)))
    cli(
        [kind, stage_config(tmp_path, ws, kind, **sections)],
        2,
        *[_ws(ws, w) for w in words],
        capsys=capsys,
        caplog=caplog,
        watch=[ws, tmp_path],
    )


# --------------------------------------------------------------------------- an output folder of an earlier run
@pytest.mark.parametrize("kind, earlier", [("train", "run"), ("reward", "checkpoint-3"), ("sft", "config.json")])
def test_a_folder_with_an_earlier_run_is_refused(ws, kind, earlier, capsys, caplog, tmp_path):
    if kind == "train":
        argv, out = ["train", CONFIG, "--output_dir", ws / "run"], ws / "run"
    else:
        out = tmp_path / kind
        out.mkdir()
        (out / earlier).mkdir() if earlier.startswith("checkpoint") else (out / earlier).write_text("{}\n")
        argv = [kind, stage_config(tmp_path, ws, kind)]
    # --resume is offered where there is a checkpoint to resume, not in a folder that holds a model without one.
    resume = "Start a new run over it" if kind == "sft" else "Continue it with --resume"
    err = cli(
        argv,
        2,
        "already holds a run",
        resume,
        "--overwrite_output_dir",
        capsys=capsys,
        caplog=caplog,
        watch=[ws, tmp_path],
    )
    assert str(out) in err


@pytest.mark.slow
def test_overwrite_output_dir_moves_the_earlier_run_aside(ws, capsys, caplog, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(ws / "run", out)
    before = snapshot(out)
    cli(
        [
            "train",
            CONFIG,
            "--output_dir",
            out,
            "--total_steps",
            "1",
            "--reward_fn",
            f"{ws / 'rewards.py'}:good",
            "--overwrite_output_dir",
            *FAST,
        ],
        0,
        capsys=capsys,
        caplog=caplog,
        watch=[ws],
        new_files=True,
    )
    moved = list(tmp_path.glob("run.previous*"))
    assert [p.name for p in moved] == ["run.previous"]
    assert {p.replace(str(out), str(moved[0]), 1): d for p, d in before.items()} == snapshot(moved[0])
    assert [p.name for p in checkpoint_dirs(out)] == ["checkpoint-1"]


# --------------------------------------------------------------------------- deeper errors, same reporting
@pytest.mark.slow
def test_deeper_data_and_model_errors(ws, capsys, caplog, tmp_path):
    base = ["train", CONFIG, "--output_dir", tmp_path / "out"]
    good = ["--reward_fn", f"{ws / 'rewards.py'}:good"]
    refused = {  # options: what the message names
        ("--prompts", ws / "latin1.jsonl", *good): ["data.prompts", "latin1.jsonl", "not UTF-8", "line 1"],
        ("--prompts", ws / "no_column.jsonl", *good): [
            "no_column.jsonl",
            "no column 'prompt'",
            "columns present: text",
        ],
        ("--prompts", ws / "empty.jsonl", *good): ["data.prompts", "empty.jsonl", "is empty: it holds no rows"],
        ("--prompts", ws / "broken.jsonl", *good): ["data.prompts", "broken.jsonl", "line 2 is not one JSON object"],
        ("--name_or_path", ws / "bad_model", *good): ["model.name_or_path", "bad_model", "config.json"],
        ("--reward_fn", f"{ws / 'syntax.py'}:good"): ["syntax.py", "failed to import: SyntaxError", "line 1"],
        ("--reward_fn", f"{ws / 'rewards.py'}:missing"): ["rewards.py:missing", "has no 'missing'", "good"],
    }
    for options, names in refused.items():
        cli([*base, *options], 2, *names, capsys=capsys, caplog=caplog, watch=[ws], new_files=True)


@pytest.mark.parametrize(
    "function, words",
    [
        ("raises", ["ZeroDivisionError", "rewards.py, line"]),
        ("short", ["shape (1,) for 8 samples"]),
        ("nan", ["non-finite scores for 1 sample(s)", "Sample 7: prompt"]),
        ("words", ["item 0 is str 'high'"]),
        ("hangs", ["did not return within reward.timeout_s=0.3 s"]),
    ],
)
def test_a_failing_reward_function_names_itself_the_step_and_a_sample_and_keeps_the_checkpoint(
    ws, function, words, capsys, caplog, tmp_path
):
    run = tmp_path / "run"
    shutil.copytree(ws / "run", run)
    timeout = ["--timeout_s", "0.3"] if function == "hangs" else []
    err = cli(
        [
            "train",
            CONFIG,
            "--output_dir",
            run,
            "--resume",
            "--total_steps",
            "3",
            "--reward_fn",
            f"{ws / 'rewards.py'}:{function}",
            *timeout,
            *FAST,
        ],
        1,
        f"rewards.py:{function}'",
        "at step 3",
        "Sample",
        *words,
        capsys=capsys,
        caplog=caplog,
        watch=[ws, run],
        new_files=True,
    )
    assert "prompt '" in err and "response '" in err
    assert [p.name for p in checkpoint_dirs(run)] == ["checkpoint-1", "checkpoint-2"]


# --------------------------------------------------------------------------- damaged checkpoints and resume
def damage(run: Path, how: str) -> None:
    folder = run / "checkpoint-2"
    if how == "truncated weights":
        with open(folder / WEIGHTS_NAME, "r+b") as handle:
            handle.truncate(1000)
    elif how == "deleted optimizer state":
        (folder / "training_state.pt").unlink()
    elif how == "empty trainer state":
        (folder / "trainer_state.json").write_text("")
    elif how == "flipped byte":
        data = bytearray((folder / WEIGHTS_NAME).read_bytes())
        data[-1] ^= 0xFF
        (folder / WEIGHTS_NAME).write_bytes(bytes(data))


@pytest.mark.parametrize(
    "how, words",
    [
        ("truncated weights", ["trainable.safetensors has 1000 bytes"]),
        ("deleted optimizer state", ["training_state.pt is missing"]),
        ("empty trainer state", ["trainer_state.json has 0 bytes"]),
        ("flipped byte", ["trainable.safetensors differs from what was written"]),
    ],
)
def test_resume_path_to_a_damaged_checkpoint_is_an_error_and_export_refuses_it(
    ws, how, words, capsys, caplog, tmp_path
):
    run = tmp_path / "run"
    shutil.copytree(ws / "run", run)
    damage(run, how)
    cli(
        ["train", CONFIG, "--output_dir", run, "--resume", run / "checkpoint-2", "--total_steps", "3", *FAST],
        2,
        "checkpoint-2 is damaged",
        *words,
        "newest complete checkpoint of that run is",
        "checkpoint-1",
        capsys=capsys,
        caplog=caplog,
        watch=[ws, tmp_path],
    )
    cli(
        ["export", run, "--out", tmp_path / "exported"],
        2,
        "checkpoint-2 is damaged",
        *words,
        capsys=capsys,
        caplog=caplog,
        watch=[ws, tmp_path],
    )
    cli(
        ["generate", run / "checkpoint-2", "--prompts", TINY / "prompts.jsonl"],
        2,
        "checkpoint-2 is damaged",
        capsys=capsys,
        caplog=caplog,
        watch=[ws, tmp_path],
    )


def test_resume_skips_a_damaged_latest_checkpoint_a_torn_metrics_line_and_an_orphan(ws, capsys, caplog, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(ws / "run", run)
    damage(run, "truncated weights")
    with (run / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 3, "env/rew')  # a line cut by a crash
    orphan = run / f".checkpoint-3.tmp-999999999@{host_name()}-abcd"  # the temporary folder of a killed writer
    orphan.mkdir()
    (orphan / WEIGHTS_NAME).write_bytes(b"half")
    said = cli(
        [
            "train",
            CONFIG,
            "--output_dir",
            run,
            "--resume",
            "--total_steps",
            "3",
            "--reward_fn",
            f"{ws / 'rewards.py'}:good",
            *FAST,
        ],
        0,
        capsys=capsys,
        caplog=caplog,
        watch=[ws],
        new_files=True,
    )
    assert f"skipping the damaged checkpoint {run / 'checkpoint-2'}" in said and "1000 bytes" in said
    damaged = list(run.glob("checkpoint-2.damaged-*"))
    assert len(damaged) == 1 and (damaged[0] / WEIGHTS_NAME).stat().st_size == 1000
    assert not orphan.exists()
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
    side = b"".join(p.read_bytes() for p in run.glob("metrics.after-step-1.*.jsonl"))
    assert b'"step": 2' in side and b'{"step": 3, "env/rew' in side  # moved aside, not lost
    assert [p.name for p in checkpoint_dirs(run)] == ["checkpoint-2", "checkpoint-3"]


def test_legacy_checkpoints_without_a_manifest_are_checked_by_what_they_hold(ws, capsys, caplog, tmp_path):
    from hydrappo.storage.checkpoint import checkpoint_problems

    legacy = FIXTURES / "legacy"
    for name in ("ppo-checkpoint-2", "reward-checkpoint-3"):
        assert not (legacy / name / MANIFEST_NAME).exists() and checkpoint_problems(legacy / name) == []
    run = tmp_path / "old_run"
    shutil.copytree(legacy / "ppo-checkpoint-2", run / "checkpoint-2")
    (run / "checkpoint-2" / "trainer_state.json").write_text('{"step": 2, "kl_')
    cli(
        ["export", run, "--out", tmp_path / "exported"],
        2,
        "checkpoint-2 is damaged",
        "trainer_state.json does not parse",
        capsys=capsys,
        caplog=caplog,
        watch=[ws, tmp_path],
    )
    with open(run / "checkpoint-2" / "training_state.pt", "r+b") as handle:
        handle.truncate(5000)
    (run / "checkpoint-2" / "trainer_state.json").write_text('{"step": 2}')
    cli(
        ["train", CONFIG, "--output_dir", run, "--resume", run / "checkpoint-2"],
        2,
        "checkpoint-2 is damaged",
        "training_state.pt does not parse",
        capsys=capsys,
        caplog=caplog,
        watch=[ws, tmp_path],
    )


def test_resume_combined_with_overwrite_or_into_another_run(ws, capsys, caplog, tmp_path):
    cli(
        ["train", CONFIG, "--output_dir", ws / "run", "--resume", "--overwrite_output_dir"],
        2,
        "--resume",
        "--overwrite_output_dir",
        "give one of them",
        capsys=capsys,
        caplog=caplog,
        watch=[ws, tmp_path],
    )
    other = tmp_path / "other"
    (other / "checkpoint-3").mkdir(parents=True)  # a run of its own (a folder of a failed run's logs blocks nothing)
    cli(
        ["train", CONFIG, "--output_dir", other, "--resume", ws / "run" / "checkpoint-1"],
        2,
        "already holds a run",
        str(other),
        capsys=capsys,
        caplog=caplog,
        watch=[ws, tmp_path],
    )


def test_truncated_sampling_is_said_once(caplog):
    from hydrappo.config import parse_config

    for _ in range(2):
        parse_config(CONFIG, ["--top_p", "0.93"])
    said = [r.getMessage() for r in caplog.records if "truncated distribution" in r.getMessage()]
    assert len(said) == 1 and "generation.top_p=0.93" in said[0]


def test_a_run_that_ended_before_its_first_checkpoint_is_not_offered_resume(ws, capsys, caplog, tmp_path):
    # What a run that failed during step 1 leaves: its TensorBoard folder, no checkpoint.
    out = tmp_path / "failed"
    (out / "tensorboard").mkdir(parents=True)
    (out / "tensorboard" / "events.out.tfevents.1").write_bytes(b"events")
    good = ["--reward_fn", f"{ws / 'rewards.py'}:good", *FAST]
    cli(
        ["train", CONFIG, "--output_dir", out, "--resume", *good],
        2,
        f"--resume: no checkpoint found in "
        f"train.output_dir={str(out)!r}, so there is nothing to continue; it holds the files of a run that ended before "
        f"its first checkpoint (tensorboard): start without --resume (they are moved to {tmp_path / 'failed.previous'}",
        capsys=capsys,
        caplog=caplog,
        watch=[ws, tmp_path],
    )


def test_an_option_that_may_not_change_on_resume_is_refused_before_the_model_loads(
    ws, capsys, caplog, tmp_path, monkeypatch
):
    import hydrappo.train.harness as harness

    def no_model(*args, **kwargs):
        raise AssertionError("the model was built before the refusal")

    monkeypatch.setattr(harness, "build_hydra", no_model)
    run = tmp_path / "run"
    shutil.copytree(ws / "run", run)
    cli(
        [
            "train",
            CONFIG,
            "--output_dir",
            run,
            "--resume",
            "--reward_fn",
            f"{ws / 'rewards.py'}:good",
            *FAST,
            "--num_layers_unfrozen",
            "1",
        ],
        2,
        f"--resume {run / 'checkpoint-2'}: model.num_layers_unfrozen: 2 in the "
        "checkpoint, 1 now; it decides which weights the checkpoint holds; resume with 2 or start a new run",
        capsys=capsys,
        caplog=caplog,
        watch=[ws, tmp_path],
    )


def test_resume_without_a_complete_checkpoint_and_resume_past_the_end(ws, capsys, caplog, tmp_path):
    good = ["--reward_fn", f"{ws / 'rewards.py'}:good", *FAST]
    cli(
        ["train", CONFIG, "--output_dir", tmp_path / "empty", "--resume", *good],
        2,
        "no checkpoint found",
        "empty",
        capsys=capsys,
        caplog=caplog,
        watch=[ws, tmp_path],
    )
    cli(
        ["train", CONFIG, "--output_dir", tmp_path, "--resume", tmp_path / "nowhere", *good],
        2,
        "--resume",
        "nowhere",
        "no such checkpoint folder",
        capsys=capsys,
        caplog=caplog,
        watch=[ws, tmp_path],
    )
    run = tmp_path / "run"
    shutil.copytree(ws / "run", run)
    for folder in checkpoint_dirs(run):
        (folder / "training_state.pt").unlink()
    cli(
        ["train", CONFIG, "--output_dir", run, "--resume", *good],
        2,
        "every checkpoint in",
        "is damaged",
        capsys=capsys,
        caplog=caplog,
        watch=[ws],
        new_files=True,
    )
    shutil.rmtree(run)
    shutil.copytree(ws / "run", run)
    out = capsys.readouterr()
    rc = main(["train", CONFIG, "--output_dir", str(run), "--resume", "--total_steps", "2", *good])
    out = capsys.readouterr()
    assert rc == 0 and "nothing to do: the run is already at step 2 and --total_steps is 2" in out.out


# --------------------------------------------------------------------------- signals
@pytest.mark.parametrize(
    "function, code, words",
    [
        ("sigint", 130, ["stopped by SIGINT after step 3", "checkpoint-3 holds it", "--resume"]),
        ("sigterm", 143, ["stopped by SIGTERM after step 3", "checkpoint-3 holds it"]),
        (
            "sigint_twice",
            130,
            ["stopped by a second SIGINT during step 3", "abandoned", "last checkpoint is", "checkpoint-2"],
        ),
    ],
)
def test_sigint_and_sigterm_stop_cleanly_and_name_the_checkpoint(ws, function, code, words, capsys, caplog, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(ws / "run", run)
    previous = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    cli(
        [
            "train",
            CONFIG,
            "--output_dir",
            run,
            "--resume",
            "--total_steps",
            "5",
            "--reward_fn",
            f"{ws / 'rewards.py'}:{function}",
            *FAST,
        ],
        code,
        *words,
        capsys=capsys,
        caplog=caplog,
        watch=[ws],
        new_files=True,
    )
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == previous  # handlers restored
    expected = ["checkpoint-1", "checkpoint-2"] if function == "sigint_twice" else ["checkpoint-2", "checkpoint-3"]
    assert [p.name for p in checkpoint_dirs(run)] == expected
    assert not [p for p in run.iterdir() if ".tmp-" in p.name]  # nothing half-written
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == ([1, 2] if function == "sigint_twice" else [1, 2, 3])


# --------------------------------------------------------------------------- a checkpoint is data
def test_generate_and_compare_run_no_code_a_checkpoint_names_unless_told(ws, capsys, caplog, tmp_path):
    checkpoint = ws / "run" / "checkpoint-2"
    (ws / "imported.log").unlink(missing_ok=True)
    prompts = ["--prompts", TINY / "prompts.jsonl", "--limit", "2", "--max_new_tokens", "3"]
    said = cli(["generate", checkpoint, *prompts, "--no_base"], 0, capsys=capsys, caplog=caplog, watch=[ws])
    assert "not scoring" in said and "--trust_checkpoint_code" in said
    assert not (ws / "imported.log").exists()  # the checkpoint's reward file never ran
    cli(["compare", checkpoint, *prompts], 0, capsys=capsys, caplog=caplog, watch=[ws])
    assert not (ws / "imported.log").exists()
    cli(
        ["generate", checkpoint, *prompts, "--no_base", "--trust_checkpoint_code"],
        0,
        capsys=capsys,
        caplog=caplog,
        watch=[ws],
        new_files=True,
    )
    assert (ws / "imported.log").exists()
    (ws / "imported.log").unlink()


GENERATE_CASES = [
    (["generate", "WS/run", "--limit", "0"], ["--limit=0"]),
    (["generate", "WS/run", "--temperature", "0"], ["--temperature=0.0"]),
    (["compare", "WS/run", "--greedy", "--temperature", "0.5"], ["--temperature=0.5", "does nothing with --greedy"]),
    (["generate", "WS/run", "--max_new_tokens", "-1"], ["--max_new_tokens=-1"]),
    (["generate", "WS/run", "--prompts", "WS/nothing.jsonl"], ["--prompts", "nothing.jsonl", "no such file"]),
    (["generate", "WS/run", "--reward_fn", "WS/none.py:f"], ["--reward_fn", "none.py"]),
    (["generate", "WS/run", "--output", "WS/bad_model"], ["--output", "is a folder"]),
    (["generate", "WS/run", "--output", "WS"], ["--output", "contains the checkpoint", "which this command reads"]),
    (["generate", "WS/nothing"], ["checkpoint", "nothing", "does not exist"]),
    (["generate", "WS/run", "--limit", "x"], ["--limit", "invalid int value"]),
    (["compare", "WS/run/checkpoint-2", "WS/no_model", "--prompts", "WS/run"], ["no_model", "no such checkpoint"]),
    (["compare", "WS/run/checkpoint-2"], ["--prompts"]),
    (["export", "WS/nothing", "--out", "WS/out"], ["WS/nothing", "does not exist"]),
    (
        ["export", "WS/run", "--out", "WS/bad_model"],
        ["--out", "already exists and is not empty", "--overwrite_output_dir"],
    ),
    (["export", "WS/run", "--out", "WS/run"], ["--out", "contains the checkpoint", "which this command reads"]),
    (["export", "WS/run", "--out", "WS/a_file.txt"], ["--out", "a_file.txt", "is a file"]),
    (["export", "WS/run", "--out", "WS/out", "--max-shard-size", "5XB"], ["--max-shard-size='5XB'"]),
    (["export", "WS/run", "--out", "WS/out", "--value-head", "WS/bad_model"], ["--value-head", "is a folder"]),
    (["export", "WS/run", "--out", "WS/out", "--dtype", "float8"], ["--dtype", "float8"]),
    (["export", "WS/run", "--out", "WS/out", "--device", "gpu"], ["--device='gpu'"]),
    (["memory", "--batch-size", "0"], ["batch_size must be >= 1"]),
    (["memory", "-N", "-5", "smollm2-135m"], ["num_layers_unfrozen must be >= -1"]),
    (["memory", "/no/such/model.json"], ["/no/such/model.json"]),
    (["bogus"], ["unknown command 'bogus'"]),
]


@pytest.mark.parametrize("argv, words", GENERATE_CASES, ids=[" ".join(c[0][:1] + c[0][2:]) for c in GENERATE_CASES])
def test_generate_compare_export_memory_errors(ws, argv, words, capsys, caplog):
    cli([_ws(ws, a) for a in argv], 2, *[_ws(ws, w) for w in words], capsys=capsys, caplog=caplog, watch=[ws])


def test_export_overwrite_moves_the_earlier_export_aside(ws, capsys, caplog, tmp_path):
    out = tmp_path / "policy"
    out.mkdir()
    (out / "note.txt").write_text("an earlier export\n")
    cli(
        ["export", ws / "run", "--out", out, "--overwrite_output_dir"],
        0,
        capsys=capsys,
        caplog=caplog,
        watch=[ws],
        new_files=True,
    )
    (moved,) = tmp_path.glob("policy.previous-*")
    assert (moved / "note.txt").read_text() == "an earlier export\n" and (out / "config.json").is_file()


# --------------------------------------------------------------------------- --debug
def test_debug_shows_the_traceback(ws, capsys, monkeypatch, tmp_path):
    argv = ["train", CONFIG, "--output_dir", str(tmp_path / "out"), "--mini_batch_size", "-8"]
    assert main([*argv, "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "ppo.mini_batch_size=-8" in err
    monkeypatch.setenv("HYDRAPPO_DEBUG", "1")
    assert main(argv) == 2
    assert "Traceback" in capsys.readouterr().err


def test_no_arguments_and_help_print_usage(capsys):
    assert main([]) == 2 and "usage: hydrappo COMMAND" in capsys.readouterr().out
    assert main(["generate", "--help"]) == 0 and "--trust_checkpoint_code" in capsys.readouterr().out


# --------------------------------------------------------------------------- kill -9 during a checkpoint write
KILLED_WRITER = """
import sys, time
from pathlib import Path
import hydrappo.storage.checkpoint as checkpoint

real = checkpoint.write_manifest

def write_manifest(folder):
    real(folder)
    if Path(folder).name.startswith(".checkpoint-2."):
        Path(sys.argv[1]).write_text(str(folder))
        time.sleep(300)  # killed here: checkpoint-2's files are written, the folder not yet renamed

checkpoint.write_manifest = write_manifest
from hydrappo.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.slow
def test_kill_9_during_a_checkpoint_write_then_resume_ends_with_the_same_weights(ws, capsys, caplog, tmp_path):
    run, marker = tmp_path / "run", tmp_path / "writing"
    argv = [
        "train",
        CONFIG,
        "--output_dir",
        str(run),
        "--total_steps",
        "2",
        "--reward_fn",
        f"{ws / 'rewards.py'}:good",
        *FAST,
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(marker), *argv],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 240
        while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marker.exists(), process.stderr.read().decode()[-2000:] if process.poll() is not None else "timed out"
    finally:
        process.kill()
        process.wait()
    assert process.returncode == -signal.SIGKILL
    assert [p.name for p in checkpoint_dirs(run)] == ["checkpoint-1"]
    orphans = [p for p in run.iterdir() if p.name.startswith(".checkpoint-2.tmp-")]
    assert len(orphans) == 1 and (orphans[0] / MANIFEST_NAME).is_file()

    cli([*argv, "--resume"], 0, capsys=capsys, caplog=caplog, watch=[ws], new_files=True)
    assert not [p for p in run.iterdir() if ".tmp-" in p.name]  # the dead writer's folder is gone
    resumed = load_file(str(run / "checkpoint-2" / WEIGHTS_NAME))
    straight = load_file(str(ws / "run" / "checkpoint-2" / WEIGHTS_NAME))
    assert resumed.keys() == straight.keys() and all((resumed[k] == straight[k]).all() for k in resumed)
    modes = {p.stat().st_mode for p in (run / "checkpoint-2").iterdir()}
    assert len(modes) == 1  # every file of a checkpoint has the same mode
