"""Conversions in and out of hydrappo.

    hydrappo export CHECKPOINT --out DIR [--value-head FILE] [--max-shard-size 2GB]
        a hydrappo checkpoint (output_dir/checkpoint-<step>, or output_dir for the newest)
        -> a plain transformers model directory (config, tokenizer, safetensors weights)
        holding the trained policy. Loads with AutoModelForCausalLM.from_pretrained alone.
    hydrappo export trlx SOURCE --out CHECKPOINT_DIR --write-base BASE_DIR
        a trlX AutoModelForCausalLMWithHydraValueHead checkpoint -> a hydrappo checkpoint
        (top-layer weights + value head) and the base model it sits on, to keep training.
    hydrappo export gguf SOURCE --out DIR
        a GGUF file (or the bundled smollm2-135m-instruct) -> float32 safetensors model
        directory (the same as tools/convert_gguf.py).

Exit code 2 on bad input (missing checkpoint or base model, weights that do not fit, a
non-empty --out without --overwrite). Outputs are written to a temporary sibling folder
and renamed when complete.

How a checkpoint becomes a model: the base model is rebuilt from the model section of
the checkpoint's config.yaml exactly as training built it (hydrappo.models.build_hydra;
`random_init` models are re-created from train.seed), the trainable weights are loaded
into it (hydrappo.checkpoint.load_trainable_weights), LoRA adapters are merged, and
the policy (`hydra.model`) is saved with `save_pretrained`. A trained lm_head that was
tied to the input embeddings is exported untied (config.tie_word_embeddings = false).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

logger = logging.getLogger("hydrappo.export")

SUBCOMMANDS = ("checkpoint", "trlx", "gguf")
EXPORT_INFO_NAME = "hydrappo_export.json"
_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


class ExportError(ValueError):
    """A conversion cannot be done as asked; the message says what to change."""


# --------------------------------------------------------------------------- shared helpers


def check_output_dir(out: str | os.PathLike, overwrite: bool) -> Path:
    """Refuse a non-empty output directory (or a file in its place) unless overwriting."""
    from .models import _is_nonempty_dir

    path = Path(out).expanduser().absolute()
    if path.exists() and not path.is_dir():
        raise ExportError(f"output {str(path)!r} exists and is not a directory.")
    if _is_nonempty_dir(path) and not overwrite:
        raise ExportError(f"output directory {str(path)!r} is not empty; choose another or pass --overwrite.")
    return path


def check_output_file(path: str | os.PathLike | None, overwrite: bool) -> Path | None:
    if path is None:
        return None
    path = Path(path).expanduser().absolute()
    if path.exists() and (path.is_dir() or not overwrite):
        raise ExportError(f"{str(path)!r} exists; choose another file or pass --overwrite.")
    return path


def write_directory(out: Path, overwrite: bool, fill) -> Path:
    """Call `fill(tmp)` on a fresh temporary sibling of `out`, then rename it into place."""
    import shutil

    from .models import _move_into_place, _tmp_sibling

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_sibling(out)
    try:
        fill(tmp)
        for path in (tmp, *tmp.rglob("*")):
            path.chmod(0o755 if path.is_dir() else 0o644)
        _move_into_place(tmp, out, overwrite)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def save_pretrained_dir(model, tokenizer, tmp: Path, max_shard_size: str | int) -> None:
    """transformers' own writer: config.json, generation_config.json, safetensors shards
    (with an index when there are several) and the tokenizer files."""
    model.config.name_or_path = ""
    model.save_pretrained(str(tmp), max_shard_size=max_shard_size)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(tmp))


# --------------------------------------------------------------------------- checkpoint -> transformers


def find_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint folder, or the newest checkpoint inside an output_dir."""
    from .checkpoint import CONFIG_NAME, WEIGHTS_NAME, latest_checkpoint

    path = Path(path).expanduser()
    if (path / WEIGHTS_NAME).is_file():
        if not (path / CONFIG_NAME).is_file():
            raise ExportError(f"{path} has {WEIGHTS_NAME} but no {CONFIG_NAME}: the model it trains is unknown.")
        return path
    if path.is_dir():
        found = latest_checkpoint(path)
        if found is not None:
            return found
    raise ExportError(
        f"{str(path)!r} is not a hydrappo checkpoint (no {WEIGHTS_NAME} in it) nor an output_dir holding checkpoint-<step> folders."
    )


def _resolve_location(value: str | None, checkpoint: Path, what: str) -> str | None:
    """A path recorded in a checkpoint's config.yaml. Recent checkpoints record absolute
    paths; older ones the path as written in the config file, relative to that file's folder,
    which is unknown here: try the current directory and the checkpoint's parents."""
    from .models import BUNDLED_MODELS

    if value is None or Path(value).expanduser().exists() or value.lower() in BUNDLED_MODELS:
        return value
    if not Path(value).is_absolute():
        for root in (checkpoint, checkpoint.parent, checkpoint.parent.parent):
            candidate = root / value
            if candidate.exists():
                return str(candidate)
    raise ExportError(
        f"{what} {value!r} recorded in {checkpoint / 'config.yaml'} does not exist (relative paths were resolved against "
        f"the training config file's folder). Pass --base-model PATH{' and --tokenizer PATH' if 'tokenizer' in what else ''}."
    )


def checkpoint_dtype(checkpoint: Path) -> torch.dtype | None:
    """The dtype the trunk was trained in: that of the checkpoint's model weights."""
    from safetensors import safe_open

    from .checkpoint import WEIGHTS_NAME

    names = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
    with safe_open(str(checkpoint / WEIGHTS_NAME), "pt") as handle:
        for key in handle.keys():
            if key.startswith("model.") and "lora_" not in key:
                return names.get(handle.get_slice(key).get_dtype())
    return None


def load_checkpoint_hydra(
    checkpoint: str | os.PathLike,
    *,
    base_model: str | None = None,
    tokenizer: str | None = None,
    dtype: torch.dtype | None = None,
    device: str = "cpu",
):
    """Rebuild a checkpoint's HydraModel with its trained weights. Returns (hydra, tokenizer, config).
    `dtype` (default: the dtype of the checkpoint's weights, i.e. training's) is the dtype
    the base model is loaded in; float16 loads as float32 on the CPU."""
    from .checkpoint import CheckpointError, load_trainable_weights
    from .config import ConfigError
    from .evaluate import load_checkpoint_config
    from .models import build_hydra
    from .trainer import seed_everything

    checkpoint = find_checkpoint(checkpoint)
    config = load_checkpoint_config(checkpoint)
    model = config.model
    if base_model is not None:
        model.name_or_path, model.gguf_file = base_model, None
    else:
        model.name_or_path = _resolve_location(model.name_or_path, checkpoint, "the base model")
    if tokenizer is not None:
        model.tokenizer_name_or_path = tokenizer
    else:
        model.tokenizer_name_or_path = _resolve_location(model.tokenizer_name_or_path, checkpoint, "the tokenizer")
    config.lora.lora_init_adapter = _resolve_location(config.lora.lora_init_adapter, checkpoint, "lora_init_adapter")

    wanted = dtype or checkpoint_dtype(checkpoint)
    if wanted is not None:
        # Rebuild in the dtype training used: random-init weights and rounding depend on it.
        cpu_half = wanted == torch.float16 and torch.device(device).type == "cpu"
        model.dtype = "float32" if cpu_half else _DTYPE_NAMES[wanted]
    seed_everything(config.train.seed)
    try:
        hydra, tok = build_hydra(model, config.lora, device=torch.device(device))
        load_trainable_weights(hydra, checkpoint)
    except CheckpointError as error:
        raise ExportError(str(error)) from error
    except (ConfigError, OSError) as error:
        raise ExportError(f"cannot rebuild the model of {checkpoint}: {error}") from error
    return hydra, tok, config


def policy_model(hydra):
    """The trained policy as a plain transformers model (LoRA adapters merged)."""
    if getattr(hydra, "uses_lora", False):
        from .lora import merged_model

        return merged_model(hydra)
    return hydra.model


def save_value_head(hydra, path: Path) -> None:
    """The value head alone: keys of hydrappo.heads.ValueHead (mlp.0.weight, ...), float32."""
    from safetensors.torch import save_file

    state = {k: v.detach().cpu().contiguous() for k, v in hydra.value_head.state_dict().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path), metadata={"format": "pt", "hydrappo": "value_head", "hidden_size": str(hydra.arch.hidden_size)})


def save_reward_branch(hydra, config, checkpoint: Path, path: Path) -> None:
    """The reward branch the run used (model.reward_branch_path): its top layers, norm and head."""
    from safetensors.torch import save_file

    branch_path = config.model.reward_branch_path
    if not branch_path:
        raise ExportError(f"{checkpoint} was trained without a reward branch (model.reward_branch_path is empty).")
    branch_path = _resolve_location(branch_path, checkpoint, "the reward branch")
    try:
        from .reward_trainer import load_reward_branch
    except ImportError as error:  # pragma: no cover - depends on the installed version
        raise ExportError(f"this hydrappo cannot load reward branches: {error}") from error
    from .checkpoint import CheckpointError

    try:
        branch = load_reward_branch(hydra, branch_path)
    except CheckpointError as error:
        raise ExportError(str(error)) from error
    state = {k: v.detach().cpu().contiguous() for k, v in branch.state_dict().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path), metadata={"format": "pt", "hydrappo": "reward_branch", "source": str(branch_path)})


def export_checkpoint(
    checkpoint: str | os.PathLike,
    out: str | os.PathLike,
    *,
    base_model: str | None = None,
    tokenizer: str | None = None,
    dtype: torch.dtype | None = None,
    max_shard_size: str | int = "5GB",
    value_head: str | os.PathLike | None = None,
    reward_branch: str | os.PathLike | None = None,
    overwrite: bool = False,
    device: str = "cpu",
) -> Path:
    """Write the trained policy of `checkpoint` as a transformers model directory `out`.
    `dtype` casts the written weights (default: the dtype training used)."""
    out = check_output_dir(out, overwrite)
    value_head = check_output_file(value_head, overwrite)
    reward_branch = check_output_file(reward_branch, overwrite)
    checkpoint = find_checkpoint(checkpoint)
    hydra, tok, config = load_checkpoint_hydra(checkpoint, base_model=base_model, tokenizer=tokenizer, device=device)
    model = policy_model(hydra)
    out_dtype = dtype or checkpoint_dtype(checkpoint)
    if out_dtype is not None and next(model.parameters()).dtype != out_dtype:
        model.to(out_dtype)
    trainer_state = json.loads((checkpoint / "trainer_state.json").read_text()) if (checkpoint / "trainer_state.json").is_file() else {}
    info = {
        "source": str(checkpoint.resolve()),
        "step": trainer_state.get("step"),
        "base_model": config.model.name_or_path,
        "num_layers_unfrozen": hydra.num_layers_unfrozen,
        "train_lm_head": hydra.train_lm_head,
        "train_final_norm": hydra.train_final_norm,
        "lora": bool(getattr(hydra, "uses_lora", False)),
    }

    def fill(tmp: Path) -> None:
        save_pretrained_dir(model, tok, tmp, max_shard_size)
        (tmp / EXPORT_INFO_NAME).write_text(json.dumps(info, indent=2) + "\n")

    write_directory(out, overwrite, fill)
    if value_head is not None:
        save_value_head(hydra, value_head)
    if reward_branch is not None:
        save_reward_branch(hydra, config, checkpoint, reward_branch)
    return out


# --------------------------------------------------------------------------- trlX -> hydrappo

# Buffers that old transformers versions stored in state dicts and current ones recompute.
_IGNORED_KEY_SUFFIXES = ("rotary_emb.inv_freq", "attn.bias", "attn.masked_bias", "position_ids")


@dataclass
class TrlxConversion:
    checkpoint: Path
    base_model: str
    num_layers_unfrozen: int
    train_lm_head: bool
    train_final_norm: bool
    frozen_head: bool


def load_state_dict_files(source: str | os.PathLike) -> dict[str, torch.Tensor]:
    """A state dict from a file (.bin/.pt/.pth with torch.load(weights_only=True), or
    .safetensors) or a directory (single file or sharded, with its index)."""
    from safetensors.torch import load_file

    path = Path(source).expanduser()
    if path.is_dir():
        for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
            index = path / index_name
            if index.is_file():
                shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
                state = {}
                for shard in shards:
                    state.update(load_state_dict_files(path / shard))
                return state
        for name in ("model.safetensors", "pytorch_model.bin", "model.bin", "pytorch_model.pt"):
            if (path / name).is_file():
                return load_state_dict_files(path / name)
        raise ExportError(f"{path} holds no model.safetensors, pytorch_model.bin or sharded index.")
    if not path.is_file():
        raise ExportError(f"{str(path)!r} does not exist.")
    if path.suffix == ".safetensors":
        return load_file(str(path))
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as error:
        raise ExportError(f"cannot read {path} as a weights-only torch file: {error}") from error
    for wrapper in ("module", "state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(wrapper), dict) and not any(
            isinstance(v, torch.Tensor) for v in state.values()
        ):
            state = state[wrapper]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ExportError(f"{path} is not a state dict (a mapping of names to tensors).")
    return state


def _split_prefix(state: dict, prefix: str) -> dict:
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


def _load_hf_config(config: str | os.PathLike | None, source: Path):
    from transformers import AutoConfig

    candidates = [Path(config).expanduser()] if config else [source if source.is_dir() else source.parent]
    for candidate in candidates:
        directory = candidate.parent if candidate.is_file() else candidate
        file = candidate if candidate.is_file() else candidate / "config.json"
        if file.is_file():
            if file.name == "config.json":
                return AutoConfig.from_pretrained(str(directory))
            data = json.loads(file.read_text())
            return AutoConfig.for_model(data.pop("model_type"), **data)
    raise ExportError(
        f"no config.json next to {source}: pass --config (the base model's config.json or its directory)."
    )


def _empty_model(config, dtype: torch.dtype):
    """A causal LM of `config` whose weights will all be overwritten: skip the random init."""
    from transformers import AutoModelForCausalLM

    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # pragma: no cover - other transformers versions
        from contextlib import nullcontext as no_init_weights
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def _module_names(model) -> dict[int, str]:
    return {id(module): name for name, module in model.named_modules()}


def _ignorable(key: str) -> bool:
    return any(key == suffix or key.endswith("." + suffix) for suffix in _IGNORED_KEY_SUFFIXES)


def _load_exact(model, state: dict, what: str) -> None:
    """load_state_dict that allows only a tied lm_head to be missing and old buffers to be extra."""
    from .arch import output_embeddings

    expected = model.state_dict()
    head = output_embeddings(model)
    head_key = f"{_module_names(model)[id(head)]}.weight"
    tied = head.weight is model.get_input_embeddings().weight
    state = {k: v for k, v in state.items() if not (_ignorable(k) and k not in expected)}
    missing = sorted(set(expected) - set(state) - ({head_key} if tied else set()))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ExportError(
            f"{what} does not fit {type(model).__name__} built from the config: missing {missing[:4]}"
            f"{'...' if len(missing) > 4 else ''}, unexpected {unexpected[:4]}{'...' if len(unexpected) > 4 else ''}. "
            "Is --config the config of the model trlX trained?"
        )
    for key, value in state.items():
        if tuple(value.shape) != tuple(expected[key].shape):
            raise ExportError(f"{what}: {key} has shape {tuple(value.shape)}, the model expects {tuple(expected[key].shape)}.")
    model.load_state_dict(state, strict=False)


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.shape == b.shape and torch.equal(a.float(), b.float())


def convert_trlx(
    source: str | os.PathLike,
    out: str | os.PathLike,
    *,
    config: str | os.PathLike | None = None,
    write_base: str | os.PathLike | None = None,
    base_model: str | os.PathLike | None = None,
    num_layers_unfrozen: int | None = None,
    tokenizer: str | os.PathLike | None = None,
    max_shard_size: str | int = "5GB",
    overwrite: bool = False,
) -> TrlxConversion:
    """Convert a trlX hydra checkpoint to a hydrappo checkpoint directory `out`.

    trlX's state dict holds `base_model.*` (the trained causal LM), `v_head.*` (an MLP
    h -> 2h -> 1, the same shape as hydrappo's value head) and, when it trained the top N
    layers, `frozen_head.*` (decoder_blocks.0..N-1, final_norm, lm_head: the original top
    of the model, i.e. the reference). hydrappo's reference is the base model it is built
    on, so the base to keep training on is the trained trunk (trlX leaves the bottom layers
    frozen but trains the embeddings) with the ORIGINAL top from frozen_head: `write_base`
    writes exactly that model directory. Without a frozen head (trlX's num_layers_unfrozen
    = -1), `base_model` must be the original model (trlX's reference), and N is found by
    comparing layers. The policy's trained top layers (and lm_head / final norm where trlX
    changed them) become trainable.safetensors.
    """
    from safetensors.torch import save_file

    from .arch import locate, output_embeddings
    from .checkpoint import CONFIG_NAME, TRAINER_STATE_NAME, WEIGHTS_NAME, load_trainable_weights
    from .config import Config
    from .hydra import HydraModel

    source = Path(source).expanduser()
    out = check_output_dir(out, overwrite)
    if write_base is None and base_model is None:
        raise ExportError(
            "give --write-base DIR (write the base model this checkpoint trains on; recommended) or --base-model DIR "
            "(the original model trlX started from, checked against the checkpoint)."
        )
    write_base = check_output_dir(write_base, overwrite) if write_base is not None else None
    state = load_state_dict_files(source)
    if any("lora_" in k for k in state):
        raise ExportError(
            "this is a trlX checkpoint with peft (LoRA) adapters: merge them into the model first "
            "(PeftModel.merge_and_unload) and convert the merged model's state dict."
        )
    policy = _split_prefix(state, "base_model.")
    v_head = _split_prefix(state, "v_head.")
    frozen = _split_prefix(state, "frozen_head.")
    other = sorted(k for k in state if not k.startswith(("base_model.", "v_head.", "frozen_head.")))
    if not policy:
        raise ExportError(
            f"{source} has no base_model.* weights: not a trlX AutoModelForCausalLMWithHydraValueHead state dict "
            f"(keys look like {sorted(state)[:3]})."
        )
    if other:
        raise ExportError(f"{source}: unexpected keys outside base_model./v_head./frozen_head.: {other[:4]}.")
    if set(v_head) != {"0.weight", "0.bias", "2.weight", "2.bias"}:
        raise ExportError(
            f"{source}: the value head has keys {sorted(v_head)[:6]}; hydrappo converts trlX's MLP value head "
            "(v_head.0 and v_head.2). A value branch with its own layers (num_value_layers_unfrozen > 0) has no "
            "hydrappo equivalent."
        )

    hf_config = _load_hf_config(config, source)
    floats = [v.dtype for v in policy.values() if v.is_floating_point()]
    dtype = max(set(floats), key=floats.count)
    model = _empty_model(hf_config, dtype)
    arch = locate(model)
    names = _module_names(model)
    num_layers = arch.num_layers
    layer_names = [names[id(layer)] for layer in arch.layers]
    norm_name = names[id(arch.final_norm)] if arch.final_norm is not None else None
    head_name = names[id(output_embeddings(model))]
    head_key = f"{head_name}.weight"
    embed_key = f"{names[id(model.get_input_embeddings())]}.weight"
    tied = output_embeddings(model).weight is model.get_input_embeddings().weight
    policy = {k: v for k, v in policy.items() if not _ignorable(k)}
    if tied and head_key not in policy:
        policy[head_key] = policy[embed_key]

    def under(state_dict, prefix):
        return {k: v for k, v in state_dict.items() if prefix is not None and k.startswith(prefix + ".")}

    original = None
    if base_model is not None:
        from transformers import AutoModelForCausalLM

        try:
            original = AutoModelForCausalLM.from_pretrained(str(base_model), dtype=dtype).state_dict()
        except (OSError, ValueError) as error:
            raise ExportError(f"cannot load --base-model {base_model}: {error}") from error
        if tied and head_key not in original:
            original[head_key] = original[embed_key]

    blocks = {}
    if frozen:
        for key, value in frozen.items():
            part, _, rest = key.partition(".")
            if part == "decoder_blocks":
                index, _, sub = rest.partition(".")
                blocks.setdefault(int(index), {})[sub] = value
            elif part not in ("final_norm", "lm_head") and not _ignorable(key):
                raise ExportError(f"{source}: unexpected frozen_head key {key!r}.")
        found = max(blocks) + 1 if blocks else 0
        if sorted(blocks) != list(range(found)):
            raise ExportError(f"{source}: frozen_head.decoder_blocks has indices {sorted(blocks)}, expected 0..{found - 1}.")
        if num_layers_unfrozen is not None and num_layers_unfrozen != found:
            raise ExportError(f"--num-layers-unfrozen {num_layers_unfrozen} contradicts the checkpoint's frozen head ({found} layers).")
        n = found
        # The reference: the trained trunk with the original top from the frozen head.
        reference = dict(policy)
        for offset, sub_state in blocks.items():
            for sub, value in sub_state.items():
                reference[f"{layer_names[num_layers - n + offset]}.{sub}"] = value
        for key, value in _split_prefix(frozen, "final_norm.").items():
            if norm_name is None:
                raise ExportError("the trlX checkpoint has a frozen final norm but the model has none.")
            reference[f"{norm_name}.{key}"] = value
        for key, value in _split_prefix(frozen, "lm_head.").items():
            reference[f"{head_name}.{key}"] = value
        reference = {k: v for k, v in reference.items() if not _ignorable(k)}
        if original is not None and write_base is None:
            differing = sorted(k for k in reference if k in original and not _same(reference[k], original[k]))
            if differing:
                raise ExportError(
                    f"the trlX checkpoint's frozen trunk and reference differ from --base-model in {len(differing)} "
                    f"tensors (e.g. {differing[:3]}; trlX also trains the embeddings): pass --write-base DIR instead."
                )
    else:
        if original is None:
            raise ExportError(
                f"{source} has no frozen_head (trlX trained with num_layers_unfrozen=-1 and a separate reference): "
                "pass --base-model, the original model trlX started from."
            )
        reference = {k: v for k, v in original.items() if not _ignorable(k)}
        first_changed = next(
            (i for i, name in enumerate(layer_names)
             if any(not _same(v, reference.get(k)) for k, v in under(policy, name).items())),
            num_layers,
        )  # fmt: skip
        trunk_changed = any(
            not _same(v, reference.get(k))
            for k, v in policy.items()
            if not any(k.startswith(name + ".") for name in layer_names)
            and not (norm_name and k.startswith(norm_name + "."))
            and k != head_key
        )
        inferred = num_layers if trunk_changed else num_layers - first_changed
        if num_layers_unfrozen is not None and num_layers_unfrozen != -1 and num_layers_unfrozen < inferred:
            raise ExportError(
                f"--num-layers-unfrozen {num_layers_unfrozen}: the checkpoint changed {inferred} top layers (or the "
                "embeddings) relative to --base-model."
            )
        n = inferred if num_layers_unfrozen is None else (num_layers if num_layers_unfrozen == -1 else num_layers_unfrozen)

    full = n >= num_layers
    train_final_norm = full or any(not _same(v, reference.get(k)) for k, v in under(policy, norm_name).items())
    train_lm_head = full or not _same(policy.get(head_key), reference.get(head_key))
    if tied and train_lm_head and not full:
        # The trunk keeps the trained embeddings, the reference keeps the original head:
        # the base model gets its own (untied) lm_head.
        for cfg in {id(c): c for c in (hf_config, hf_config.get_text_config())}.values():
            cfg.tie_word_embeddings = False
        model = _empty_model(hf_config, dtype)
    elif tied:
        reference.pop(head_key, None)
    _load_exact(model, reference, f"the base model rebuilt from {source}")

    hydra = HydraModel(model, -1 if full else n, train_lm_head=train_lm_head, train_final_norm=train_final_norm)
    weights = {}
    for name, param in hydra.named_parameters():
        if not param.requires_grad:
            continue
        if name.startswith("model."):
            value = policy.get(name[len("model.") :])
        elif name.startswith("value_head.mlp."):
            value = v_head.get(name[len("value_head.mlp.") :])
        else:
            value = None
        if value is None or tuple(value.shape) != tuple(param.shape):
            raise ExportError(f"no weights of the right shape for hydrappo's {name} in {source}.")
        weights[name] = value.to(param.dtype).contiguous()

    base_location = str(write_base) if write_base is not None else str(Path(base_model).expanduser().absolute())
    run = Config()
    run.model.name_or_path = base_location
    run.model.num_layers_unfrozen = -1 if full else n
    run.model.train_lm_head = bool(train_lm_head and not full)
    run.model.train_final_norm = bool(train_final_norm and not full)
    run.model.dtype = _DTYPE_NAMES.get(dtype, "auto")
    tokenizer_source = tokenizer or (source if source.is_dir() else source.parent)
    tok = _try_tokenizer(tokenizer_source)
    if write_base is None and tokenizer:
        run.model.tokenizer_name_or_path = str(Path(tokenizer).expanduser().absolute())

    import yaml

    trainer_state = {
        "step": 0,
        "hydra": {"num_layers_unfrozen": hydra.num_layers_unfrozen, "train_lm_head": hydra.train_lm_head,
                  "train_final_norm": hydra.train_final_norm, "lora": False},
        "converted_from": {"format": "trlx", "source": str(source.absolute()), "frozen_head": bool(frozen)},
    }  # fmt: skip

    if write_base is not None:  # the model as built: the reference, before any policy weight goes in
        write_directory(write_base, overwrite, lambda tmp: save_pretrained_dir(model, tok, tmp, max_shard_size))
        if tok is None:
            logger.warning("no tokenizer found at %s: the base model directory has none; pass --tokenizer", tokenizer_source)

    def fill(tmp: Path) -> None:
        save_file(weights, str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
        (tmp / TRAINER_STATE_NAME).write_text(json.dumps(trainer_state, indent=2))
        (tmp / CONFIG_NAME).write_text(yaml.safe_dump(run.to_dict(), sort_keys=False))

    write_directory(out, overwrite, fill)
    # The written checkpoint must load into a hydra built on the written base.
    load_trainable_weights(hydra, out)
    return TrlxConversion(out, base_location, hydra.num_layers_unfrozen, hydra.train_lm_head, hydra.train_final_norm, bool(frozen))


def _try_tokenizer(location):
    from transformers import AutoTokenizer

    path = Path(location).expanduser()
    if not path.is_dir() or not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        return None
    try:
        return AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------- command line


def _dtype_arg(text: str | None):
    if text is None:
        return None
    names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}  # fmt: skip
    if text not in names:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(names)}")
    return names[text]


def _checkpoint_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Write a hydrappo checkpoint's trained policy as a transformers model directory (config, "
        "tokenizer, safetensors) that loads with AutoModelForCausalLM.from_pretrained alone.",
        epilog="examples:\n  hydrappo export outputs/run/checkpoint-100 --out models/policy\n"
        "  hydrappo export outputs/run --out models/policy --value-head models/value_head.safetensors\n"
        "  hydrappo export CKPT --out DIR --base-model path/to/base --max-shard-size 2GB --dtype bfloat16\n\n"
        "other conversions: hydrappo export trlx --help, hydrappo export gguf --help",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("checkpoint", help="a checkpoint folder (output_dir/checkpoint-<step>) or an output_dir (newest)")
    parser.add_argument("--out", required=True, help="output model directory (must be empty or new)")
    parser.add_argument("--base-model", help="base model location, overriding the checkpoint's config.yaml (if it moved)")
    parser.add_argument("--tokenizer", help="tokenizer location, overriding the checkpoint's config.yaml")
    parser.add_argument("--dtype", type=_dtype_arg, help="dtype of the written weights (default: the training dtype)")
    parser.add_argument("--max-shard-size", default="5GB", help="largest safetensors shard, e.g. 2GB (default 5GB)")
    parser.add_argument("--value-head", help="also write the value head to this .safetensors file")
    parser.add_argument("--reward-branch", help="also write the run's reward branch to this .safetensors file")
    parser.add_argument("--device", default="cpu", help="where to rebuild the model (default cpu)")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty --out (and existing files)")
    return parser


def _trlx_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Convert a trlX hydra checkpoint (AutoModelForCausalLMWithHydraValueHead: base_model.*, v_head.*, "
        "frozen_head.*) to a hydrappo checkpoint, to keep training with hydrappo.",
        epilog="examples:\n  hydrappo export trlx trlx_ckpt/ --out converted/checkpoint-0 --write-base converted/base\n"
        "  hydrappo export trlx trlx_ckpt/pytorch_model.bin --config base/config.json --out CKPT --base-model base/\n\n"
        "The checkpoint holds the trained top layers and value head; --write-base writes the model it sits on (trlX's\n"
        "trained trunk with the original top layers, i.e. trlX's reference). Point model.name_or_path at it, with\n"
        "the num_layers_unfrozen / train_lm_head / train_final_norm printed here (also in the checkpoint's config.yaml),\n"
        "and load the weights with hydrappo.checkpoint.load_trainable_weights(hydra, CKPT).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("source", help="trlX checkpoint: a directory (pytorch_model.bin, model.safetensors, shards) or a file")
    parser.add_argument("--out", required=True, help="hydrappo checkpoint directory to write")
    parser.add_argument("--write-base", help="write the base model directory (config, tokenizer, safetensors) here")
    parser.add_argument("--base-model", help="the original model trlX started from (needed without a frozen head)")
    parser.add_argument("--config", help="the model's config.json or its directory (default: next to SOURCE)")
    parser.add_argument("--tokenizer", help="tokenizer directory (default: SOURCE's directory)")
    parser.add_argument("--num-layers-unfrozen", type=int, help="N, when the checkpoint has no frozen head to tell")
    parser.add_argument("--max-shard-size", default="5GB", help="largest safetensors shard of --write-base")
    parser.add_argument("--overwrite", action="store_true", help="replace non-empty output directories")
    return parser


def _gguf_parser(prog: str) -> argparse.ArgumentParser:
    from .models import BUNDLED_MODELS

    parser = argparse.ArgumentParser(
        prog=prog,
        description="Dequantise a GGUF model to a float32 safetensors model directory (model + tokenizer); "
        "the same as tools/convert_gguf.py.",
    )
    parser.add_argument("source", help=f"a bundled name ({', '.join(BUNDLED_MODELS)}), a .gguf file, or a directory with --gguf-file")
    parser.add_argument("--gguf-file", default=None, help="GGUF file inside the source directory")
    parser.add_argument("--out", required=True, help="output model directory (created)")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in SUBCOMMANDS else "checkpoint"
    if argv and argv[0] in SUBCOMMANDS:
        argv = argv[1:]
    sub_prog = prog or ("hydrappo export" if command == "checkpoint" else f"hydrappo export {command}")
    parser = {"checkpoint": _checkpoint_parser, "trlx": _trlx_parser, "gguf": _gguf_parser}[command](sub_prog)
    args = parser.parse_args(argv)
    logging.getLogger("transformers").setLevel(logging.ERROR)

    from .config import ConfigError

    try:
        if command == "checkpoint":
            out = export_checkpoint(
                args.checkpoint, args.out, base_model=args.base_model, tokenizer=args.tokenizer, dtype=args.dtype,
                max_shard_size=args.max_shard_size, value_head=args.value_head, reward_branch=args.reward_branch,
                overwrite=args.overwrite, device=args.device,
            )  # fmt: skip
            print(f"wrote the trained policy of {find_checkpoint(args.checkpoint)} to {out}")
            if args.value_head:
                print(f"wrote the value head to {args.value_head}")
        elif command == "trlx":
            result = convert_trlx(
                args.source, args.out, config=args.config, write_base=args.write_base, base_model=args.base_model,
                num_layers_unfrozen=args.num_layers_unfrozen, tokenizer=args.tokenizer,
                max_shard_size=args.max_shard_size, overwrite=args.overwrite,
            )  # fmt: skip
            print(
                f"wrote hydrappo checkpoint {result.checkpoint} on base model {result.base_model}\n"
                f"  model.name_or_path: {result.base_model}\n  model.num_layers_unfrozen: {result.num_layers_unfrozen}\n"
                f"  model.train_lm_head: {str(result.train_lm_head).lower()}\n"
                f"  model.train_final_norm: {str(result.train_final_norm).lower()}"
            )
        else:
            from .models import ModelLoadError, gguf_to_safetensors, resolve_model_source

            directory, gguf_file = resolve_model_source(args.source, args.gguf_file)
            if gguf_file is None:
                raise ModelLoadError(f"{args.source!r} is a model directory without a .gguf file: nothing to convert.")
            out = gguf_to_safetensors(directory, gguf_file, args.out, overwrite=args.overwrite)
            print(f"converted {Path(directory) / gguf_file} -> {out}")
    except (ExportError, ConfigError, FileNotFoundError) as error:
        print(f"{sub_prog}: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
