"""The training commands' front: `hydrappo train | reward | dpo | sft CONFIG.yaml [--resume [PATH]]
[--option value ...]`, from the command line to a trainer (stage.TrainingStage) and its summary.

Everything that can be refused is refused before anything is written or any weights load: the
config is parsed and checked, the data and reward functions read (inputs.py), every Hub id
resolved, and only then the output folder claimed (storage/rundir.start_run). The trainers are
imported when a command runs, so that `hydrappo --help` stays quick.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .. import usercode
from ..console import launcher_process, report


def _config_command(argv: list[str], prog: str, description: str, config_cls):
    """The front of every command that takes CONFIG.yaml, `--resume [PATH]` and `--option value`
    overrides. Returns the parsed config, the checkpoint to resume from and the stage's inputs
    (train/inputs.py), or an exit code after the help."""
    from ..config import config_parser, parse_config

    parser = usercode.CommandParser(prog=prog, description=description, add_help=False)
    parser.add_argument("config", nargs="?", help="YAML config (see examples/)")
    parser.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        default=None,
        help="continue from the latest checkpoint in train.output_dir, or from PATH",
    )
    parser.add_argument("-h", "--help", action="store_true")
    args, overrides = parser.parse_known_args(argv)
    if args.help or args.config is None:
        print(parser.format_help())
        print("Config options (YAML keys under their section, or --name value on the command line):")
        config_parser(config_cls).print_help()
        return 0 if args.help else 2
    config = parse_config(args.config, overrides, config_cls)
    from ..storage.run_tokenizer import adopt_recorded_tokenizer

    # A run given its tokenizer in Python saved it in its folder: resumed, it continues with that one.
    adopt_recorded_tokenizer(args.resume, config)
    from ..storage.models import fetch_hub_models
    from ..storage.rundir import start_run  # before any model loads: output_dir claimed, --resume's checkpoint
    from .api import refuse_without_chat_template
    from .inputs import read_inputs

    # Before anything is written: the data and reward functions, checked (train/inputs.py), and
    # every Hub id, cached or downloaded.
    stage_inputs = read_inputs(config)
    fetch_hub_models(config)
    refuse_without_chat_template(config, stage_inputs)  # before a GGUF file converts (a minute)
    _plan_against_the_gpu(config)
    resume = start_run(config, args.resume, writer=launcher_process()[0] == 0)
    return config, resume, stage_inputs


def _plan_against_the_gpu(config) -> None:
    """A PPO run on one GPU: the planner's plan of it against the memory free there, before the
    model loads; one that will not fit stops here (planner/preflight.py). On the CPU nothing runs.
    Under a launcher, or with the trunk sharded (train.fsdp_trunk), each process holds a part of
    the run the planner does not plan: not checked."""
    from ..config import Config
    from ..storage.models import pick_device

    if not isinstance(config, Config) or launcher_process()[1] > 1 or config.train.fsdp_trunk:
        return
    device = pick_device(config.train.device)
    if device.type != "cuda":
        return
    from ..planner.preflight import check_run_fits

    check_run_fits(config, device)


def _trainer(stage: str):
    if stage == "ppo":
        from .ppo import PPOTrainer

        return PPOTrainer
    if stage == "reward":
        from .reward_model import RewardTrainer

        return RewardTrainer
    if stage == "dpo":
        from .dpo import DPOTrainer

        return DPOTrainer
    from .sft import SFTTrainer

    return SFTTrainer


@dataclass(frozen=True)
class Stage:
    """A training command: CONFIG.yaml + overrides -> a trainer (train/stage.TrainingStage) -> its summary."""

    description: str
    config: str  # the config class, in hydrappo.config
    trainer: Callable  # () -> the trainer class (imported on use: `hydrappo --help` stays quick)
    summary: str  # its line in `hydrappo --help`


STAGES = {
    "train": Stage(
        "Run PPO. Options after the config file override it, e.g. --learning_rate 3e-6.",
        "Config",
        lambda: _trainer("ppo"),
        "PPO from a YAML config",
    ),
    "reward": Stage(
        "Train a reward branch on preference pairs (prompt, chosen, rejected). Options after the config "
        "file override it, e.g. --learning_rate 1e-4.",
        "RewardConfig",
        lambda: _trainer("reward"),
        "train a reward branch on preference pairs",
    ),
    "dpo": Stage(
        "Direct preference optimisation (DPO, IPO, hinge, robust DPO, SimPO) of the top layers, a band or LoRA "
        "adapters on preference pairs (prompt, chosen, rejected: text, message lists or an implicit prompt), the "
        "reference being the frozen copy of what trains; writes a model directory. Options after the config file "
        "override it, e.g. --beta 0.1.",
        "DPOConfig",
        lambda: _trainer("dpo"),
        "DPO and its family on preference pairs; writes a model directory",
    ),
    "sft": Stage(
        "Supervised fine-tuning of the top layers (or LoRA adapters) on prompt/response pairs; writes a model "
        "directory (or adapter) that a PPO config can start from. Options after the config file override it.",
        "SFTConfig",
        lambda: _trainer("sft"),
        "supervised fine-tuning of the top layers; writes a model directory",
    ),
}


def stage_command(name: str, argv: list[str]) -> int:
    """`hydrappo train | reward | dpo | sft CONFIG.yaml [--resume [PATH]] [--option value ...]`."""
    from .. import config as configs

    stage = STAGES[name]
    parsed = _config_command(argv, f"hydrappo {name}", stage.description, getattr(configs, stage.config))
    if isinstance(parsed, int):
        return parsed
    config, resume, inputs = parsed
    trainer = stage.trainer()(config, inputs=inputs)
    history = trainer.train(resume=resume)
    if not history:
        more = trainer.more_steps_option
        report(
            f"nothing to do: the run is already at step {trainer.step} and {more} is {trainer.total_steps}; "
            f"raise {more} to train it further."
        )
        return 0
    report(trainer.summary(history))
    return 0
