"""A model key (``model.path``, ``teacher.path``, ``reward_model.path``, ``critic.path``) given as a Hugging Face
Hub name rather than a directory: resolved from the local Hugging Face cache in the launching process, before any
worker. A name the cache lacks would otherwise become a download (or an offline error) inside every worker, in a
traceback that never names the key; here it is one line saying what was looked up where and what to do."""

from __future__ import annotations

from pathlib import Path


def _cached_snapshot(name: str) -> Path | None:
    """The local cache's snapshot directory of Hub model ``name`` (where its ``config.json`` is), else None."""
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(name, "config.json")
    return Path(cached).parent if isinstance(cached, str) else None


def _hub_name(path) -> bool:
    """Could ``path`` be a Hub repository id (``gpt2``, ``org/name``) rather than a file-system path?"""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(str(path))
    except HFValidationError:
        return False
    return True


def local_model_dir(path) -> Path:
    """``path`` itself when it exists here or is no Hub name; a Hub name's snapshot directory in the local cache
    when it is there (the workers' ``from_pretrained(name)`` reads the same files)."""
    local = Path(str(path))
    if local.exists() or not _hub_name(path):
        return local
    return _cached_snapshot(str(path)) or local


def hub_problem(path, key: str) -> str | None:
    """One line when ``path`` (the value of ``key``) is a Hub name that is neither a local path nor in the local
    cache; None otherwise (a missing file-system path is the caller's to name)."""
    if Path(str(path)).exists() or not _hub_name(path) or _cached_snapshot(str(path)) is not None:
        return None
    from huggingface_hub.constants import HF_HUB_CACHE

    return (f"{key} {path} is neither a local directory nor a Hugging Face Hub model in the local cache "
            f"(looked up {path}/config.json in {HF_HUB_CACHE}, set by HF_HOME / HF_HUB_CACHE): give a model "
            f"directory, or download it first (hf download {path})")
