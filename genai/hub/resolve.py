"""`resolve_model`: a path, a cached model's name or a hub model name to a model folder."""

from __future__ import annotations

import os
from pathlib import Path

from genai.errors import (
    DownloadError,
    ModelFileNotFoundError,
)
from genai.hub.download import pull
from genai.hub.inventory import cached_models
from genai.hub.layout import (
    CONFIG_FILENAME,
    HubRef,
    genai_models_dir,
    hub_cache_dir,
    is_offline,
    looks_like_repo_id,
)
from genai.hub.lookup import cached_folder


def resolve_model(
    spec: str | os.PathLike[str],
    *,
    download: bool | None = None,
    progress: bool = True,
    cache_dir: str | os.PathLike[str] | None = None,
) -> str:
    """The model folder for ``spec``: an existing path as given; else a name of genai's
    cache as `cached_models` lists it (e.g. the default model's folder name); else a hub model
    name, taken from the hub cache, else downloaded (and built, for a GGUF or safetensors repo).
    Any other text with a path separator is returned as it is (the caller reports it).

    ``download``: ``None`` downloads unless ``HF_HUB_OFFLINE`` is set; ``False`` never.
    Raises ModelFileNotFoundError for a bare name that is neither a folder nor a cached model
    (or a cached repo without a model folder), DownloadError when the model is not cached (or
    only partly: an interrupted download) and may not or cannot be downloaded.
    """
    text = os.fspath(spec)
    if Path(text).exists():
        return text
    if text and "/" not in text and os.sep not in text and text not in (".", ".."):
        local = genai_models_dir() / text
        if (local / CONFIG_FILENAME).is_file():
            return str(local)
        raise ModelFileNotFoundError(_unknown_name(text, cache_dir))
    if not looks_like_repo_id(text):
        return text
    ref = HubRef.parse(text)
    cache = Path(cache_dir) if cache_dir is not None else hub_cache_dir()
    folder = cached_folder(ref, cache, progress)
    if folder is not None:
        return str(folder)
    allowed = not is_offline() if download is None else download and not is_offline()
    if not allowed:
        why = "HF_HUB_OFFLINE is set" if is_offline() else "downloads are off"
        raise DownloadError(
            f"{ref} is not in the Hugging Face cache ({cache}) and {why}: run "
            f"`genai pull {ref}` while online, or pass a model folder"
        )
    return str(pull(ref, progress=progress, cache_dir=cache))


def _unknown_name(text: str, cache_dir: str | os.PathLike[str] | None) -> str:
    """The error for ``-m TEXT`` that is neither a folder nor a cached model's name."""
    names = [m.name for m in cached_models(cache_dir)]
    close = [n for n in names if text.lower() in n.lower()]
    if close:
        hint = "did you mean " + " or ".join(close[:5]) + "?"
    elif names:
        more = f", ... ({len(names) - 8} more)" if len(names) > 8 else ""
        hint = "cached: " + ", ".join(names[:8]) + more
    else:
        hint = "no model is cached (`genai pull` fetches one)"
    return (
        f"{text!r} is neither a model folder nor the name of a cached model; {hint} "
        "(`genai list` shows the names)"
    )
