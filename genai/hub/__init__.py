"""Model folders from the Hugging Face hub, offline first.

A model is named ``REPO_ID[@REVISION][:SUBFOLDER]`` (``microsoft/Phi-3-mini-4k-instruct-onnx:
cpu_and_mobile/cpu-int4-rtn-block-32-acc-level-4``). :func:`resolve_model` turns such a name into
a model folder: an existing local path is used as it is; a repo is looked up in the hub cache
(the library's standard cache, ``$HF_HUB_CACHE``) and downloaded only when it is not there and
downloads are allowed (not with ``HF_HUB_OFFLINE=1``). :func:`pull` downloads with the
``huggingface_hub`` library (its cache layout and progress bars): an ONNX repo's model folder as
it is; a GGUF or safetensors repo is then built with ``genai build`` into the genai cache
(:func:`built_dir`). :func:`cached_models` lists what is cached and :func:`remove` deletes it.

``og.Model`` keeps the reference's API (a folder path, never a network call): pass it
``resolve_model(name)``, a ``str`` the reference reads as well.
"""

from genai.hub.download import pull
from genai.hub.inventory import CachedModel, cached_models, remove
from genai.hub.layout import (
    CONFIG_FILENAME,
    PULLING_DIRNAME,
    SOURCE_FILENAME,
    CacheError,
    HubRef,
    built_dir,
    hub_cache_dir,
    is_offline,
    looks_like_repo_id,
    repo_folder_name,
)
from genai.hub.resolve import resolve_model

__all__ = [
    "CONFIG_FILENAME",
    "PULLING_DIRNAME",
    "SOURCE_FILENAME",
    "CacheError",
    "CachedModel",
    "HubRef",
    "built_dir",
    "cached_models",
    "hub_cache_dir",
    "is_offline",
    "looks_like_repo_id",
    "pull",
    "remove",
    "repo_folder_name",
    "resolve_model",
]
