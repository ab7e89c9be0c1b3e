"""The reward-branch file format: a `hydrappo reward` checkpoint, and loading it onto a trunk.

A reward checkpoint is an ordinary checkpoint folder (storage/checkpoint.py) whose
`trainable.safetensors` holds the branch (layers.*, norm.*, head.*) and whose
`trainer_state.json` holds, besides the step, `kind: hydrappo-reward-branch`, the base
model's identity (including a fingerprint of the frozen trunk the branch sits on), the
pooling the head reads (`last` or `mean`; checkpoints without it mean `last`), the number of
heads (`reward_heads`, an ensemble's; checkpoints without it hold one), the score statistics on
a reference set (an ensemble's: each head's too, which standardise its scores) and the final
evaluation. `load_reward_branch(hydra,
path)` puts it into a HydraModel's reward slot; `path` may also be the reward run's
output_dir (its latest checkpoint is used).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from ..errors import UsageError
from ..model import HydraModel, RewardBranch
from .atomic import is_nonempty_dir, write_directory
from .checkpoint import (
    CONFIG_NAME,
    TRAINER_STATE_NAME,
    WEIGHTS_NAME,
    CheckpointError,
    find_checkpoint,
    load_trainable_weights,
    read_trainer_state,
    write_manifest,
)

logger = logging.getLogger("hydrappo")

REWARD_KIND = "hydrappo-reward-branch"
REWARD_FORMAT_VERSION = 1
# Relative difference of the frozen trunk's weight statistics above which a reward branch
# is taken to sit on another trunk. bf16 vs float32 copies of one model differ far less.
FINGERPRINT_RTOL = 1e-3


def trunk_fingerprint(hydra: HydraModel) -> dict[str, float]:
    """Sum of |w| of every frozen parameter below the split (embeddings, bottom layers):
    what a reward branch sees of the trunk. Tolerant to dtype, exact enough to tell models apart.
    A quantized trunk (model/quantize.py) answers with the sums of its original weights, so a
    branch fits the same model quantized or not."""
    top = {id(p) for p in hydra.arch.layers[hydra.split_index :].parameters()}
    if hydra.arch.final_norm is not None:
        top |= {id(p) for p in hydra.arch.final_norm.parameters()}
    original = getattr(hydra, "unquantized_abs_sums", {})
    return {
        name: original[name] if name in original else param.detach().abs().sum(dtype=torch.float64).item()
        for name, param in hydra.arch.decoder.named_parameters()
        if id(param) not in top
    }


def base_model_identity(hydra: HydraModel, name_or_path: str | None = None) -> dict:
    config = hydra.config.get_text_config() if hasattr(hydra.config, "get_text_config") else hydra.config
    return {
        "name_or_path": name_or_path,
        "model_name_or_path": getattr(hydra.model, "name_or_path", None),
        "model_type": getattr(config, "model_type", None),
        "num_layers": hydra.arch.num_layers,
        "hidden_size": hydra.arch.hidden_size,
        "vocab_size": _vocab_size(hydra.model.get_input_embeddings()),
        # The branch's layers: from the split to the top (N for top N; a band's and those above it).
        "num_layers_unfrozen": hydra.branch_depth,
        "trunk_fingerprint": trunk_fingerprint(hydra),
    }


def _vocab_size(embedding) -> int:
    # A 4-bit embedding (model/quantize.py) stores its weight packed: its shape is not the vocabulary's.
    return getattr(embedding, "num_embeddings", None) or embedding.weight.shape[0]


def branch_weights(branch: RewardBranch) -> dict[str, torch.Tensor]:
    return {name: p.detach().cpu().contiguous() for name, p in branch.named_parameters()}


def save_reward_folder(output_dir: str | Path, branch: RewardBranch, info: dict, config_yaml: str) -> Path:
    """A reward checkpoint folder without optimizer state (the weights, `info` as trainer_state.json,
    the config, a manifest): what RewardTrainer.save_model writes, loadable by `load_reward_branch`.
    Written whole or not at all; a folder that holds anything but an earlier one is refused."""
    import json

    from safetensors.torch import save_file

    out = Path(output_dir)
    if is_nonempty_dir(out) and not (out / TRAINER_STATE_NAME).is_file():
        raise UsageError(
            f"save_model: {out} holds other files; give a new or empty folder (an earlier reward checkpoint "
            "saved there is replaced)."
        )

    def fill(folder: Path) -> None:
        save_file(branch_weights(branch), str(folder / WEIGHTS_NAME), metadata={"format": "pt"})
        (folder / TRAINER_STATE_NAME).write_text(json.dumps(info, indent=2))
        (folder / CONFIG_NAME).write_text(config_yaml)
        write_manifest(folder)

    return write_directory(out, fill, replace=True)


def read_reward_info(path: str | Path) -> tuple[Path, dict]:
    """(checkpoint folder, its reward metadata); errors if it is not a reward checkpoint."""
    folder = find_checkpoint(path, "reward checkpoint (model.reward_branch_path)")
    info = read_trainer_state(folder)
    if info.get("kind") != REWARD_KIND:
        raise CheckpointError(
            f"{folder} is not a reward checkpoint (it looks like a PPO checkpoint or another kind). "
            "Train a reward branch with `hydrappo reward CONFIG.yaml` and point model.reward_branch_path at its output."
        )
    if info.get("format_version", 0) > REWARD_FORMAT_VERSION:
        raise CheckpointError(f"{folder} was written by a newer hydrappo (format {info['format_version']}); upgrade.")
    if not (folder / WEIGHTS_NAME).is_file():
        raise CheckpointError(f"{folder} is incomplete: {WEIGHTS_NAME} is missing.")
    return folder, info


def check_base_model(hydra: HydraModel, base: dict, source: str) -> None:
    """Errors when a reward branch cannot sit on this trunk; info/warning when it was
    trained on a model of another name that has the same frozen bottom (e.g. an SFT model)."""
    if hydra.full_model:
        raise CheckpointError(
            "a reward branch needs a frozen trunk: with num_layers_unfrozen=-1 (the whole model trains) there is none."
        )
    here = base_model_identity(hydra)
    for key, what in (
        ("hidden_size", "hidden size"),
        ("num_layers", "number of decoder layers"),
        ("vocab_size", "vocabulary size"),
        ("model_type", "model type"),
    ):
        if base.get(key) is not None and base[key] != here[key]:
            raise CheckpointError(
                f"{source} was trained on another base model: its {what} is {base[key]}, this model's is {here[key]} "
                f"(reward branch trained on {base.get('name_or_path')!r}). Train the reward branch on the PPO base model."
            )
    if base["num_layers_unfrozen"] != here["num_layers_unfrozen"]:
        n, split = base["num_layers_unfrozen"], here["num_layers"] - base["num_layers_unfrozen"]
        raise CheckpointError(
            f"{source} has {n} reward layers but this hydra splits the trunk at {here['num_layers_unfrozen']} "
            f"layers below the top: set model.num_layers_unfrozen: {n} (or a model.trainable_layers band starting at "
            f"layer {split}), or train the reward branch with the same split as PPO."
        )
    theirs, ours = base.get("trunk_fingerprint") or {}, here["trunk_fingerprint"]
    differing = [
        name
        for name in ours
        if name not in theirs or abs(theirs[name] - ours[name]) > FINGERPRINT_RTOL * max(abs(ours[name]), 1e-12)
    ]
    if theirs and (differing or set(theirs) != set(ours)):
        raise CheckpointError(
            f"{source} was trained on a trunk whose frozen bottom differs from this model's "
            f"({len(differing)} of {len(ours)} parameters differ, e.g. {differing[:2]}): reward branch base "
            f"{base.get('name_or_path')!r}, PPO base {hydra.model.name_or_path!r}. Its scores would be meaningless here; "
            "train the reward branch on the PPO base model (an SFT model that trained only the top layers keeps the bottom)."
        )
    if base.get("model_name_or_path") and base["model_name_or_path"] != here["model_name_or_path"]:
        logger.warning(
            "reward branch %s was trained on %r, PPO uses %r: the frozen bottom layers are identical, so it fits.",
            source,
            base.get("name_or_path") or base["model_name_or_path"],
            here["model_name_or_path"],
        )


def load_reward_branch(hydra: HydraModel, path: str | Path) -> RewardBranch:
    """A `hydrappo reward` checkpoint as a RewardBranch for `hydra.attach_reward_branch`.

    `path` is a checkpoint folder or the reward run's output_dir (latest checkpoint).
    Raises CheckpointError when the checkpoint is not a reward checkpoint or was trained
    on another base model (hidden size, layers, N, or a different frozen bottom). The
    checkpoint's metadata, including the score statistics, is `branch.checkpoint_info`."""
    folder, info = read_reward_info(path)
    check_base_model(hydra, info["base_model"], str(folder))
    # checkpoints older than ensembles hold one head, under the same weight names (model/heads.py)
    branch = hydra.new_reward_branch(trainable=False, own_norm=True, heads=info.get("reward_heads", 1))
    if not info.get("has_norm", True):  # trained on a model without a final norm
        branch.norm = None
    branch.pooling = info.get("pooling", "last")  # checkpoints older than the option read the last token
    load_trainable_weights(branch, folder, names={name for name, _ in branch.named_parameters()})
    stats = info.get("score_stats") or {}
    if "head_score_mean" in stats:  # an ensemble's heads answer standardised scores once its training ended
        branch.head.standardise(stats["head_score_mean"], stats["head_score_std"])
    branch.requires_grad_(False)
    branch.checkpoint_info = {k: v for k, v in info.items() if k != "base_model"} | {"path": str(folder)}
    return branch


def apply_reference_stats(reward_args, branch: RewardBranch) -> None:
    """With `reward.score_normalization: ref` and the reward branch as the reward source,
    fill reward.score_ref_mean / score_ref_std that the config leaves unset from the
    reward checkpoint (explicit values win), so that the run's saved config holds them."""
    if reward_args.score_normalization != "ref" or not reward_args.use_reward_branch:
        return
    if reward_args.score_ref_mean is not None and reward_args.score_ref_std is not None:
        return
    info = getattr(branch, "checkpoint_info", {}) or {}
    mean, std = info.get("score_mean"), info.get("score_std")
    if mean is None or std is None:
        raise CheckpointError(
            f"reward.score_normalization is 'ref' but the reward checkpoint {info.get('path', '')} holds no score "
            "statistics (it was saved before training ended). Use the final checkpoint, set reward.score_ref_mean "
            "and reward.score_ref_std, or use score_normalization: running."
        )
    if reward_args.score_ref_mean is None:
        reward_args.score_ref_mean = float(mean)
    if reward_args.score_ref_std is None:
        reward_args.score_ref_std = float(std)
    logger.info(
        "reward scores normalised with the reward checkpoint's reference statistics: mean %.4f, std %.4f",
        reward_args.score_ref_mean,
        reward_args.score_ref_std,
    )
