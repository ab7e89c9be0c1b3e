"""trlX hydra checkpoints both ways: trlX -> hydrappo, so trlX users keep training, and back.

    hydrappo export trlx SOURCE --out CHECKPOINT_DIR --write-base BASE_DIR     trlX -> hydrappo
    hydrappo export to-trlx CHECKPOINT --out DIR                               hydrappo -> trlX

trlX's AutoModelForCausalLMWithHydraValueHead state dict holds `base_model.*`, `v_head.*`
and `frozen_head.*`; see `convert_trlx` and `convert_to_trlx`. `.bin` files are read with
weights_only=True.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import yaml

from ..config import Config
from ..model import HydraModel
from ..model.arch import locate, output_embeddings
from .atomic import write_directory
from .checkpoint import (
    CONFIG_NAME,
    TRAINER_STATE_NAME,
    WEIGHTS_NAME,
    find_checkpoint,
    load_trainable_weights,
    write_manifest,
)
from .export import EXPORT_INFO_NAME, ExportError, check_output_dir, dtype_name, save_pretrained_dir
from .models import is_hub_id, local_source

logger = logging.getLogger("hydrappo.export")


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
        if (
            isinstance(state, dict)
            and isinstance(state.get(wrapper), dict)
            and not any(isinstance(v, torch.Tensor) for v in state.values())
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
    model.tie_weights()  # transformers 5 leaves a tied head untied under no_init_weights
    return model.eval()


def _module_names(model) -> dict[int, str]:
    return {id(module): name for name, module in model.named_modules()}


def _ignorable(key: str) -> bool:
    return any(key == suffix or key.endswith("." + suffix) for suffix in _IGNORED_KEY_SUFFIXES)


def _load_exact(model, state: dict, what: str) -> None:
    """load_state_dict that allows only a tied lm_head to be missing and old buffers to be extra."""
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
            raise ExportError(
                f"{what}: {key} has shape {tuple(value.shape)}, the model expects {tuple(expected[key].shape)}."
            )
    model.load_state_dict(state, strict=False)


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.shape == b.shape and torch.equal(a.float(), b.float())


@dataclass(frozen=True)
class _TrlxParts:
    """A trlX hydra state dict, split by owner."""

    policy: dict  # base_model.*: the trained causal LM
    value_head: dict  # v_head.*: MLP h -> 2h -> 1
    frozen_head: dict  # frozen_head.*: the original top layers, final norm and lm_head (empty with N = -1)


def _read_trlx_parts(source: Path) -> _TrlxParts:
    """The checkpoint's three parts, refused when it is not a trlX hydra state dict hydrappo can convert."""
    state = load_state_dict_files(source)
    if any("lora_" in k for k in state):
        raise ExportError(
            "this is a trlX checkpoint with peft (LoRA) adapters: merge them into the model first "
            "(PeftModel.merge_and_unload) and convert the merged model's state dict."
        )
    parts = _TrlxParts(
        _split_prefix(state, "base_model."), _split_prefix(state, "v_head."), _split_prefix(state, "frozen_head.")
    )
    other = sorted(k for k in state if not k.startswith(("base_model.", "v_head.", "frozen_head.")))
    if not parts.policy:
        raise ExportError(
            f"{source} has no base_model.* weights: not a trlX AutoModelForCausalLMWithHydraValueHead state dict "
            f"(keys look like {sorted(state)[:3]})."
        )
    if other:
        raise ExportError(f"{source}: unexpected keys outside base_model./v_head./frozen_head.: {other[:4]}.")
    if set(parts.value_head) != {"0.weight", "0.bias", "2.weight", "2.bias"}:
        raise ExportError(
            f"{source}: the value head has keys {sorted(parts.value_head)[:6]}; hydrappo converts trlX's MLP value "
            "head (v_head.0 and v_head.2). A value branch with its own layers (num_value_layers_unfrozen > 0) has no "
            "hydrappo equivalent."
        )
    return parts


@dataclass(frozen=True)
class _ModelKeys:
    """Where a model of the checkpoint's architecture keeps what the conversion moves."""

    num_layers: int
    layer_names: list[str]
    norm_name: str | None
    head_name: str
    embed_key: str
    tied: bool

    @property
    def head_key(self) -> str:
        return f"{self.head_name}.weight"

    def under(self, state: dict, prefix: str | None) -> dict:
        """The entries of `state` inside module `prefix` (none when there is no such module)."""
        return {k: v for k, v in state.items() if prefix is not None and k.startswith(prefix + ".")}

    def in_trunk(self, key: str) -> bool:
        """Whether a key is outside every layer, the final norm and the lm_head (the embeddings, mostly)."""
        in_layer = any(key.startswith(name + ".") for name in self.layer_names)
        in_norm = bool(self.norm_name) and key.startswith(f"{self.norm_name}.")
        return not in_layer and not in_norm and key != self.head_key


def _model_keys(model) -> _ModelKeys:
    arch = locate(model)
    names = _module_names(model)
    return _ModelKeys(
        num_layers=arch.num_layers,
        layer_names=[names[id(layer)] for layer in arch.layers],
        norm_name=names[id(arch.final_norm)] if arch.final_norm is not None else None,
        head_name=names[id(output_embeddings(model))],
        embed_key=f"{names[id(model.get_input_embeddings())]}.weight",
        tied=output_embeddings(model).weight is model.get_input_embeddings().weight,
    )


def _original_state(base_model, dtype: torch.dtype, keys: _ModelKeys) -> dict:
    """--base-model's state dict (a tied head written out under its own key)."""
    from transformers import AutoModelForCausalLM

    location = local_source(base_model, option="--base-model")  # a Hub id's snapshot, or its own message
    try:
        original = AutoModelForCausalLM.from_pretrained(str(location), dtype=dtype).state_dict()
    except (OSError, ValueError) as error:
        raise ExportError(f"cannot load --base-model {base_model}: {error}") from error
    if keys.tied and keys.head_key not in original:
        original[keys.head_key] = original[keys.embed_key]
    return original


def _frozen_blocks(frozen: dict, source: Path) -> dict[int, dict]:
    """frozen_head.decoder_blocks.I.* as {I: its state dict}, checked to number 0..N-1."""
    blocks = {}
    for key, value in frozen.items():
        part, _, rest = key.partition(".")
        if part == "decoder_blocks":
            index, _, sub = rest.partition(".")
            blocks.setdefault(int(index), {})[sub] = value
        elif part not in ("final_norm", "lm_head") and not _ignorable(key):
            raise ExportError(f"{source}: unexpected frozen_head key {key!r}.")
    found = max(blocks) + 1 if blocks else 0
    if sorted(blocks) != list(range(found)):
        raise ExportError(
            f"{source}: frozen_head.decoder_blocks has indices {sorted(blocks)}, expected 0..{found - 1}."
        )
    return blocks


def _reference_from_frozen_head(
    parts: _TrlxParts, keys: _ModelKeys, source: Path, num_layers_unfrozen: int | None
) -> tuple[dict, int]:
    """(reference state dict, N): the trained trunk with the original top from the frozen head."""
    blocks = _frozen_blocks(parts.frozen_head, source)
    trained = len(blocks)
    if num_layers_unfrozen is not None and num_layers_unfrozen != trained:
        raise ExportError(
            f"--num-layers-unfrozen {num_layers_unfrozen} contradicts the checkpoint's frozen head ({trained} layers)."
        )
    reference = dict(parts.policy)
    for offset, sub_state in blocks.items():
        for sub, value in sub_state.items():
            reference[f"{keys.layer_names[keys.num_layers - trained + offset]}.{sub}"] = value
    for key, value in _split_prefix(parts.frozen_head, "final_norm.").items():
        if keys.norm_name is None:
            raise ExportError("the trlX checkpoint has a frozen final norm but the model has none.")
        reference[f"{keys.norm_name}.{key}"] = value
    for key, value in _split_prefix(parts.frozen_head, "lm_head.").items():
        reference[f"{keys.head_name}.{key}"] = value
    return {k: v for k, v in reference.items() if not _ignorable(k)}, trained


def _check_against_base(reference: dict, original: dict) -> None:
    """Without --write-base the converted checkpoint sits on --base-model: its reference must be that model."""
    differing = sorted(k for k in reference if k in original and not _same(reference[k], original[k]))
    if differing:
        raise ExportError(
            f"the trlX checkpoint's frozen trunk and reference differ from --base-model in {len(differing)} "
            f"tensors (e.g. {differing[:3]}; trlX also trains the embeddings): pass --write-base DIR instead."
        )


def _layers_trained_against(reference: dict, policy: dict, keys: _ModelKeys, num_layers_unfrozen: int | None) -> int:
    """N without a frozen head: how many top layers the policy changed relative to the original
    (all of them when it changed the embeddings), or --num-layers-unfrozen when it covers them."""
    first_changed = next(
        (
            index
            for index, name in enumerate(keys.layer_names)
            if any(not _same(value, reference.get(key)) for key, value in keys.under(policy, name).items())
        ),
        keys.num_layers,
    )
    trunk_changed = any(not _same(value, reference.get(key)) for key, value in policy.items() if keys.in_trunk(key))
    inferred = keys.num_layers if trunk_changed else keys.num_layers - first_changed
    if num_layers_unfrozen is None:
        return inferred
    if num_layers_unfrozen != -1 and num_layers_unfrozen < inferred:
        raise ExportError(
            f"--num-layers-unfrozen {num_layers_unfrozen}: the checkpoint changed {inferred} top layers (or the "
            "embeddings) relative to --base-model."
        )
    return keys.num_layers if num_layers_unfrozen == -1 else num_layers_unfrozen


def _reference(
    parts: _TrlxParts, keys: _ModelKeys, source: Path, original: dict | None, on_base: bool, num_layers_unfrozen
) -> tuple[dict, int]:
    """(reference state dict, N): from the frozen head when trlX kept one (checked against
    --base-model when the checkpoint is to sit on it: `on_base`), else --base-model itself."""
    if parts.frozen_head:
        reference, trained = _reference_from_frozen_head(parts, keys, source, num_layers_unfrozen)
        if original is not None and on_base:
            _check_against_base(reference, original)
        return reference, trained
    if original is None:
        raise ExportError(
            f"{source} has no frozen_head (trlX trained with num_layers_unfrozen=-1 and a separate reference): "
            "pass --base-model, the original model trlX started from."
        )
    reference = {k: v for k, v in original.items() if not _ignorable(k)}
    return reference, _layers_trained_against(reference, parts.policy, keys, num_layers_unfrozen)


def _trainable_weights(hydra: HydraModel, parts: _TrlxParts, source: Path) -> dict[str, torch.Tensor]:
    """The policy's values of every parameter the hydra trains (its top layers, value head, ...)."""
    weights = {}
    for name, param in hydra.named_parameters():
        if not param.requires_grad:
            continue
        if name.startswith("model."):
            value = parts.policy.get(name[len("model.") :])
        elif name.startswith("value_head.mlp."):
            value = parts.value_head.get(name[len("value_head.mlp.") :])
        else:
            value = None
        if value is None or tuple(value.shape) != tuple(param.shape):
            raise ExportError(f"no weights of the right shape for hydrappo's {name} in {source}.")
        weights[name] = value.to(param.dtype).contiguous()
    return weights


def _run_config(
    base_location: str,
    dtype: torch.dtype,
    tokenizer,
    *,
    full: bool,
    trained: int,
    train_lm_head: bool,
    train_final_norm: bool,
) -> Config:
    """The checkpoint's config.yaml: the model section a run continuing from it needs (with every
    layer trained: N = -1, the head and norm train anyway)."""
    run = Config()
    run.model.name_or_path = base_location
    run.model.num_layers_unfrozen = -1 if full else trained
    run.model.train_lm_head = bool(train_lm_head and not full)
    run.model.train_final_norm = bool(train_final_norm and not full)
    run.model.dtype = dtype_name(dtype)
    if tokenizer:
        run.model.tokenizer_name_or_path = str(Path(tokenizer).expanduser().absolute())
    return run


def _trainer_state(hydra: HydraModel, source: Path, frozen_head: bool) -> dict:
    return {
        "step": 0,
        "hydra": {
            "num_layers_unfrozen": hydra.num_layers_unfrozen,
            "train_lm_head": hydra.train_lm_head,
            "train_final_norm": hydra.train_final_norm,
            "lora": False,
        },
        "converted_from": {"format": "trlx", "source": str(source.absolute()), "frozen_head": frozen_head},
    }


def _write_checkpoint(out: Path, weights: dict, trainer_state: dict, run: Config, overwrite: bool) -> None:
    from safetensors.torch import save_file

    def fill(tmp: Path) -> None:
        save_file(weights, str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
        (tmp / TRAINER_STATE_NAME).write_text(json.dumps(trainer_state, indent=2))
        (tmp / CONFIG_NAME).write_text(yaml.safe_dump(run.to_dict(), sort_keys=False))
        write_manifest(tmp)

    write_directory(out, fill, replace=overwrite)


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
    source = Path(source).expanduser()
    out = check_output_dir(out, overwrite)
    if write_base is None and base_model is None:
        raise ExportError(
            "give --write-base DIR (write the base model this checkpoint trains on; recommended) or --base-model DIR "
            "(the original model trlX started from, checked against the checkpoint)."
        )
    write_base = check_output_dir(write_base, overwrite) if write_base is not None else None
    parts = _read_trlx_parts(source)
    hf_config = _load_hf_config(config, source)
    floats = [v.dtype for v in parts.policy.values() if v.is_floating_point()]
    dtype = max(set(floats), key=floats.count)
    model = _empty_model(hf_config, dtype)
    keys = _model_keys(model)
    policy = {k: v for k, v in parts.policy.items() if not _ignorable(k)}
    if keys.tied and keys.head_key not in policy:
        policy[keys.head_key] = policy[keys.embed_key]
    parts = replace(parts, policy=policy)
    original = _original_state(base_model, dtype, keys) if base_model is not None else None

    reference, trained = _reference(parts, keys, source, original, write_base is None, num_layers_unfrozen)
    full = trained >= keys.num_layers
    train_final_norm = full or any(
        not _same(value, reference.get(key)) for key, value in keys.under(policy, keys.norm_name).items()
    )
    train_lm_head = full or not _same(policy.get(keys.head_key), reference.get(keys.head_key))
    if keys.tied and train_lm_head and not full:
        # The trunk keeps the trained embeddings, the reference keeps the original head:
        # the base model gets its own (untied) lm_head.
        for text_config in {id(c): c for c in (hf_config, hf_config.get_text_config())}.values():
            text_config.tie_word_embeddings = False
        model = _empty_model(hf_config, dtype)
    elif keys.tied:
        reference.pop(keys.head_key, None)
    _load_exact(model, reference, f"the base model rebuilt from {source}")

    hydra = HydraModel(model, -1 if full else trained, train_lm_head=train_lm_head, train_final_norm=train_final_norm)
    weights = _trainable_weights(hydra, parts, source)
    if write_base is not None:
        base_location = str(write_base)
    else:  # a Hub id as given, a path made absolute
        base_location = str(base_model) if is_hub_id(str(base_model)) else str(Path(base_model).expanduser().absolute())
    tokenizer_source = tokenizer or (source if source.is_dir() else source.parent)
    tok = _try_tokenizer(tokenizer_source)
    run = _run_config(
        base_location,
        dtype,
        tokenizer if write_base is None else None,  # a written base holds the tokenizer
        full=full,
        trained=trained,
        train_lm_head=train_lm_head,
        train_final_norm=train_final_norm,
    )

    if write_base is not None:  # the model as built: the reference, before any policy weight goes in
        write_directory(write_base, lambda tmp: save_pretrained_dir(model, tok, tmp, max_shard_size), replace=overwrite)
        if tok is None:
            logger.warning(
                "no tokenizer found at %s: the base model directory has none; pass --tokenizer", tokenizer_source
            )
    _write_checkpoint(out, weights, _trainer_state(hydra, source, bool(parts.frozen_head)), run, overwrite)
    # The written checkpoint must load into a hydra built on the written base.
    load_trainable_weights(hydra, out)
    return TrlxConversion(
        out,
        base_location,
        hydra.num_layers_unfrozen,
        hydra.train_lm_head,
        hydra.train_final_norm,
        bool(parts.frozen_head),
    )


def _try_tokenizer(location):
    from transformers import AutoTokenizer

    path = Path(location).expanduser()
    if not path.is_dir() or not any(
        (path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json")
    ):
        return None
    try:
        return AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------- hydrappo -> trlX

TRLX_WEIGHTS_NAME = "pytorch_model.bin"  # what trlX's from_pretrained reads (torch.load)


@dataclass
class TrlxExport:
    folder: Path
    num_layers_unfrozen: int  # trlX's option: the frozen head's layers, -1 (or 0) without one
    frozen_head: bool
    fresh_value_head: bool  # a critic-free run's checkpoint has none: v_head.* is a new, untrained head


def _reference_top(hydra: HydraModel) -> tuple[list, torch.nn.Module | None, torch.nn.Module]:
    """hydrappo's reference from the split to the top: its layers, final norm and lm_head, with the
    original weights (the frozen copies and the layers above a band, or LoRA's base layers)."""
    head = output_embeddings(hydra.model)
    if hydra.uses_lora:
        from ..model.lora import strip_lora

        return [strip_lora(layer) for layer in hydra.arch.layers[hydra.split_index :]], hydra.arch.final_norm, head
    layers = [*hydra.ref_layers, *hydra.arch.layers[hydra.band_end :]]
    norm = hydra.ref_norm if hydra.ref_norm is not None else hydra.arch.final_norm
    return layers, norm, hydra.ref_lm_head if hydra.ref_lm_head is not None else head


def trlx_state_dict(hydra: HydraModel, policy, seed: int = 0) -> tuple[dict[str, torch.Tensor], bool]:
    """(the state dict trlX's hydra model holds, whether its value head is new): `base_model.*` the trained
    policy (`policy`: LoRA merged), `v_head.*` the value head, and where the reference shares the policy's
    trunk, `frozen_head.*` its top from the split (decoder_blocks.0..N-1, final_norm, lm_head). A run that
    trained every layer (or none) has no frozen head: trlX keeps such a reference as a model of its own.
    A critic-free run has no value head: a new one is made from `seed`."""
    from ..model.heads import ValueHead

    state = {f"base_model.{key}": value for key, value in policy.state_dict().items()}
    head = hydra.value_head
    if head is None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            head = ValueHead(hydra.arch.hidden_size).to(
                torch.promote_types(next(policy.parameters()).dtype, torch.float32)
            )
    state.update({f"v_head.{key}": value for key, value in head.mlp.state_dict().items()})
    if not hydra.full_model and hydra.branch_depth > 0:
        layers, norm, lm_head = _reference_top(hydra)
        for index, layer in enumerate(layers):
            state.update(layer.state_dict(prefix=f"frozen_head.decoder_blocks.{index}."))
        if norm is not None:
            state.update(norm.state_dict(prefix="frozen_head.final_norm."))
        state.update(lm_head.state_dict(prefix="frozen_head.lm_head."))
    return {key: value.detach().cpu() for key, value in state.items()}, hydra.value_head is None


def convert_to_trlx(
    checkpoint: str | os.PathLike,
    out: str | os.PathLike,
    *,
    base_model: str | None = None,
    tokenizer: str | None = None,
    device: str = "cpu",
    overwrite: bool = False,
) -> TrlxExport:
    """Write a hydrappo checkpoint as a trlX hydra checkpoint folder `out`: pytorch_model.bin with
    `trlx_state_dict`'s keys, the model's config.json and the tokenizer, what trlX's
    AutoModelForCausalLMWithHydraValueHead.from_pretrained(out, num_layers_unfrozen=N) loads and what
    `convert_trlx` reads back (to the same weights). The policy is rebuilt as for the model export
    (storage/export.py: LoRA merged, a quantized trunk re-read in full precision)."""
    from .export import load_checkpoint_hydra, policy_model

    out = check_output_dir(out, overwrite)
    checkpoint = find_checkpoint(checkpoint)
    hydra, tok, config = load_checkpoint_hydra(
        checkpoint, base_model=base_model, tokenizer=tokenizer, device=device, trunk_quantization="none"
    )
    policy = policy_model(hydra)
    state, fresh_head = trlx_state_dict(hydra, policy, config.train.seed)
    frozen = any(key.startswith("frozen_head.") for key in state)
    trlx_layers = hydra.branch_depth if frozen else (-1 if hydra.full_model else 0)
    info = {
        "source": str(checkpoint.resolve()),
        "format": "trlx",
        "base_model": config.model.name_or_path,
        "num_layers_unfrozen": trlx_layers,
        "fresh_value_head": fresh_head,
    }

    def fill(tmp: Path) -> None:
        torch.save(state, tmp / TRLX_WEIGHTS_NAME)
        policy.config.name_or_path = ""
        policy.config.save_pretrained(str(tmp))
        if tok is not None:
            tok.save_pretrained(str(tmp))
        (tmp / EXPORT_INFO_NAME).write_text(json.dumps(info, indent=2) + "\n")

    write_directory(out, fill, replace=overwrite)
    return TrlxExport(out, trlx_layers, frozen, fresh_head)
