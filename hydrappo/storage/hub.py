"""Hub ids (`ORG/NAME`): the snapshot folder huggingface_hub's cache holds for an id at a
revision, downloaded first when it is missing and the Hub may be used (docs/models.md).

Everything goes through `huggingface_hub.snapshot_download`, transformers' own resolver, so
the cache layout, `HF_HUB_CACHE` / `HF_HOME`, revisions (branch, tag or commit) and partial
downloads behave as they do for transformers. The cache is read first with
`local_files_only=True`: a cached id never waits on the network, and with `HF_HUB_OFFLINE`
set a missing one fails at once, with a message that says how to fetch it.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..config import ConfigError


class ModelLoadError(ConfigError):
    """A model or tokenizer cannot be found or loaded; the message says what to do."""


# What a Hub id's snapshot needs: config and tokenizer files, safetensors weights (a repository
# with only pytorch_model.bin files gets those instead). Not the ONNX, GGUF, TF or Flax copies.
_HUB_FILES = ("*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.jinja")
_TRUE = ("1", "on", "yes", "true")


def hub_cache_dir() -> Path:
    """The cache huggingface_hub reads: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else its default.
    Read from the environment at each call: huggingface_hub.constants fixes it at import."""
    from huggingface_hub import constants

    folder = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if not folder and os.environ.get("HF_HOME"):
        folder = os.path.join(os.environ["HF_HOME"], "hub")
    return Path(folder or constants.HF_HUB_CACHE).expanduser()


def hub_offline() -> bool:
    """`HF_HUB_OFFLINE` (or transformers' `TRANSFORMERS_OFFLINE`) is set, read at each call."""
    return any(os.environ.get(name, "").strip().lower() in _TRUE for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_snapshot(
    repo_id: str, revision: str | None = None, gguf_file: str | None = None, option: str | None = None
) -> Path:
    """The snapshot folder of a Hub id at `revision` (default main) in the Hugging Face cache,
    downloaded first when it is not cached and the Hub may be used. Never waits on the
    network when the id is cached or `HF_HUB_OFFLINE` is set. `option` (`model.name_or_path`,
    `--base-model`, ...) is what named the id, for the messages."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        IncompleteSnapshotError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    cache, named = hub_cache_dir(), f"{option}={repo_id}" if option else f"the Hub model {repo_id}"
    patterns = [*_HUB_FILES, gguf_file] if gguf_file else list(_HUB_FILES)
    fetch = dict(repo_id=repo_id, revision=revision, cache_dir=str(cache), allow_patterns=patterns)
    try:
        return Path(snapshot_download(**fetch, local_files_only=True))
    except (LocalEntryNotFoundError, IncompleteSnapshotError):
        if hub_offline():
            raise ModelLoadError(_not_cached(named, repo_id, revision, cache, offline=True)) from None
    try:
        folder = Path(snapshot_download(**fetch))
        if not gguf_file and not any(folder.glob("*.safetensors")):
            folder = Path(snapshot_download(**{**fetch, "allow_patterns": [*_HUB_FILES, "*.bin"]}))
        return folder
    except RevisionNotFoundError:
        raise ModelLoadError(
            f"model.revision={revision} is not a branch, tag or commit of the Hub model {repo_id}; "
            "give one it has (see its page's 'Files and versions'), or remove model.revision for main."
        ) from None
    except RepositoryNotFoundError:  # also gated and private repositories without a token
        raise ModelLoadError(
            f"{named} is no Hub model this machine may read (a typo, or a private or gated model), and no local "
            "folder of that name exists; correct the id, or `hf auth login` with an account that has access."
        ) from None
    except (LocalEntryNotFoundError, IncompleteSnapshotError, ConnectionError) as error:
        raise ModelLoadError(_not_cached(named, repo_id, revision, cache, offline=False)) from error
    except HfHubHTTPError as error:
        message = f"{named}: downloading it from the Hub failed: {error}".rstrip(".")
        raise ModelLoadError(f"{message}; try again later.") from error


def _not_cached(named: str, repo_id: str, revision: str | None, cache: Path, offline: bool) -> str:
    version = f" --revision {revision}" if revision else ""
    why = "HF_HUB_OFFLINE is set" if offline else "the Hub could not be reached"
    retry = "unset HF_HUB_OFFLINE to download it now" if offline else "try again when the network (HTTPS_PROXY) works"
    return (
        f"{named} (revision {revision or 'main'}) is not in the Hugging Face cache {cache} and {why}, so it cannot "
        f"be downloaded, and no local folder {repo_id!r} exists either; fetch it on a machine with network: "
        f"`hf download {repo_id}{version}` (or `huggingface-cli download {repo_id}{version}`), into this cache "
        f"(HF_HUB_CACHE or HF_HOME choose it) or copy the cache here; or {retry}."
    )
