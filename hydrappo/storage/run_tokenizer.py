"""The tokenizer a run was given as an object (the Python API's `processing_class`), kept in its folder.

Such a run saves it once, as OUTPUT_DIR/tokenizer/ (`save_pretrained`, written whole or not at all:
atomic.write_directory), and its config names that folder as model.tokenizer_name_or_path
(config/paths.run_tokenizer_path), so every checkpoint's config.yaml does: whatever rebuilds the run
from its folder (`hydrappo generate` / `compare`, `export`, `--resume` from the command line) loads
the tokenizer the run trained with, not the model's own. It is written after the output folder was
claimed (storage/rundir.py), by process 0; a resumed run checks that it was given the same one.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ..config import run_tokenizer_path
from ..errors import spell
from .atomic import write_directory
from .checkpoint import CONFIG_NAME, CheckpointError, latest_checkpoint

logger = logging.getLogger("hydrappo")

# A text whose ids tell apart tokenizers with the same vocabulary and other rules of splitting.
_PROBE = "Hello world! 12 + 30 = 42, n1 n2 g3.\n  Ünïcode 'quoted'\t<tab>"
_SPECIAL = ("bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token")


def _described(tokenizer) -> dict:
    """What of a tokenizer decides the ids a run reads and writes, and the text it renders."""
    return {
        "vocabulary": tokenizer.get_vocab(),
        "special tokens": {name: str(getattr(tokenizer, name, None)) for name in _SPECIAL},
        "added tokens": sorted(str(token) for token in tokenizer.all_special_tokens),
        "chat template": getattr(tokenizer, "chat_template", None),
        "ids of a probe text": tokenizer(_PROBE, add_special_tokens=True)["input_ids"],
    }


def tokenizer_difference(folder: str | os.PathLike, tokenizer) -> str | None:
    """What differs between the tokenizer saved in `folder` and `tokenizer` ('the chat template, ...'),
    or None when nothing that matters to a run does."""
    from transformers import AutoTokenizer

    saved, given = _described(AutoTokenizer.from_pretrained(str(folder))), _described(tokenizer)
    differ = [what for what in given if saved[what] != given[what]]
    return ", ".join(differ) or None


def record_run_tokenizer(output_dir: str | os.PathLike, tokenizer) -> Path:
    """Save `tokenizer` as the run's tokenizer folder in `output_dir` (claimed already), or, when the
    run's folder holds one (a resumed run), check that it is the same: CheckpointError if not, since
    the checkpoints' config.yaml name that folder as the tokenizer they were trained with."""
    folder = Path(run_tokenizer_path(output_dir))
    if folder.is_dir() and any(folder.iterdir()):
        difference = tokenizer_difference(folder, tokenizer)
        if difference:
            raise CheckpointError(
                f"processing_class is not the tokenizer this run trained with, which is saved in {folder} (their "
                f"{difference} differ) and named by its checkpoints' {CONFIG_NAME}. Give that one "
                f"(processing_class=AutoTokenizer.from_pretrained({str(folder)!r})) to continue the run, or start a "
                f"new run ({spell('train.overwrite_output_dir')}, or another output_dir)."
            )
        return folder
    write_directory(folder, lambda tmp: tokenizer.save_pretrained(str(tmp)))
    logger.info("the tokenizer given as processing_class is saved in %s (model.tokenizer_name_or_path)", folder)
    return folder


def adopt_recorded_tokenizer(resume, config) -> str | None:
    """A run resumed from the command line (`resume`: --resume's value, 'latest' or a checkpoint path) whose
    config names no tokenizer, from a checkpoint of a run that was given its tokenizer in Python: set
    model.tokenizer_name_or_path to the tokenizer folder that run saved (and its checkpoints' config.yaml
    name), so the run continues with the tokenizer it trained with. Only reads (it runs before the config's
    other checks: the chat template is the saved tokenizer's); returns that folder, or None when nothing changed."""
    import yaml

    if not resume or config.model.tokenizer_name_or_path:
        return None
    if resume in (True, "latest", ""):
        checkpoint = latest_checkpoint(config.train.output_dir)  # (each checkpoint of a run records the same)
        if checkpoint is None:
            return None
    else:
        checkpoint = Path(resume).expanduser()
    try:
        saved = yaml.safe_load((checkpoint / CONFIG_NAME).read_text())
    except (OSError, yaml.YAMLError):
        return None
    recorded = ((saved or {}).get("model") or {}).get("tokenizer_name_or_path") if isinstance(saved, dict) else None
    own = run_tokenizer_path(checkpoint.parent)
    if not recorded or Path(str(recorded)).expanduser().absolute() != Path(own) or not Path(own).is_dir():
        return None  # a tokenizer the config named: changing it is the user's choice (resume warns of it)
    config.model.tokenizer_name_or_path = str(recorded)
    logger.info(
        "%s: the run trained with the tokenizer it was given in Python, saved in %s: continuing with it",
        spell("resume", checkpoint),
        recorded,
    )
    return str(recorded)
