"""The same OpenAI-compatible API as a Ray Serve deployment: N replicas (each a `ServeEngine`
with its own model and continuous-batching scheduler) behind Ray's HTTP proxy, with Ray
Serve's autoscaling. Needs the ``ray`` extra (``pip install 'genai-runtime[ray]'``).

From Python::

    import ray
    from ray import serve
    from genai.serve.ray_serve import build_app

    ray.init(address="auto")                     # or ray.init() for a local head
    serve.start(http_options={"host": "0.0.0.0", "port": 8000})
    serve.run(build_app({"model": "/models/smollm2", "num_replicas": 2}), route_prefix="/")

With the Ray CLI (a config file or ``serve run``)::

    serve run genai.serve.ray_serve:build_app model=/models/smollm2 num_replicas=4

or ``genai serve --ray --replicas 4 -m /models/smollm2``. See docs/serving.md for multi-node
clusters.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ray import serve

from genai.runtime.model import Model
from genai.serve.app import ServeEngine, create_app
from genai.serve.speculative import SpeculativeServing

__all__ = ["GenaiReplica", "build_app", "deployment_options"]

#: `ServeEngine` options a deployment may set (everything else is a Ray option).
ENGINE_OPTIONS = (
    "threads",
    "model_name",
    "max_slots",
    "max_queue",
    "request_timeout",
    "prefill_chunk",
    "prefix_cache_mb",
    "lanes",
    "speculative",
    "speculative_max_streams",
    "speculative_backoff",
    "single_row_steps",
    "provider",
    "provider_options",
)
#: Engine options that are booleans.
_FLAG_OPTIONS = ("speculative_backoff", "single_row_steps")
#: Engine options that stay strings.
_TEXT_OPTIONS = ("model_name", "speculative", "provider")


def replica_engine_options(model: str, engine_options: dict[str, Any]) -> dict[str, Any]:
    """`ServeEngine.from_path` keywords of a replica of ``model`` from its deployment's
    ``engine_options``: the defaults, and ``speculative`` parsed (a draft folder loaded)."""
    options = dict(engine_options)
    options.setdefault("model_name", Path(model).name)
    # replicas are the parallelism here: one lane each unless asked (a replica does not
    # know how many of the node's cores the others use)
    options.setdefault("lanes", 1)
    # genai serve --speculative ngram[:N[:K]] | draft:DIR
    spec = options.pop("speculative", None)
    streams = int(options.pop("speculative_max_streams", 1))
    backoff = bool(options.pop("speculative_backoff", False))
    if spec:
        parsed = SpeculativeServing.parse(str(spec), streams, backoff)
        options["speculative"] = parsed.loaded(lambda d: Model(str(Path(d).resolve())))
    return options


class GenaiReplica:
    """One replica: loads the model folder and serves the FastAPI app of `create_app`
    (Ray runs the app's lifespan, which starts and stops the replica's scheduler)."""

    def __init__(
        self,
        model: str,
        engine_options: dict[str, Any] | None = None,
        api_key: str | None = None,
        allowed_origins: Sequence[str] = (),
        max_body_bytes: int | None = None,
        webui: bool = True,
        allow_remote_images: bool = False,
    ) -> None:
        options = replica_engine_options(model, engine_options or {})
        self.engine = ServeEngine.from_path(model, **options)
        if self.engine.images is not None:
            self.engine.images.allow_remote = bool(allow_remote_images)
        self.api_key = api_key
        self.allowed_origins = tuple(allowed_origins)
        self.max_body_bytes = None if max_body_bytes is None else int(max_body_bytes)
        self.webui = bool(webui)
        self.pid = os.getpid()

    def __serve_build_asgi_app__(self) -> Any:
        return create_app(
            self.engine,
            api_key=self.api_key,
            allowed_origins=self.allowed_origins,
            max_body_bytes=self.max_body_bytes,
            webui=self.webui,
        )


try:  # late-bound ingress: the app is built per replica, after __init__ loaded the model
    GenaiReplica = serve.ingress()(GenaiReplica)  # type: ignore[misc]
except (TypeError, ValueError) as exc:  # pragma: no cover - depends on the Ray version
    raise ImportError(
        "genai.serve.ray_serve needs a Ray Serve whose serve.ingress() takes no app "
        f"(__serve_build_asgi_app__; tested with ray 2.60): {exc}"
    ) from exc


def deployment_options(
    *,
    num_replicas: int | str | None = None,
    min_replicas: int | None = None,
    max_replicas: int | None = None,
    target_ongoing_requests: float | None = None,
    num_cpus: float | None = None,
    max_ongoing_requests: int | None = None,
) -> dict[str, Any]:
    """`serve.deployment` options: a fixed ``num_replicas``, or autoscaling between
    ``min_replicas`` and ``max_replicas`` aiming at ``target_ongoing_requests`` per replica
    (default: the replica's slot count)."""
    options: dict[str, Any] = {}
    if min_replicas is not None or max_replicas is not None or num_replicas == "auto":
        options["autoscaling_config"] = {
            "min_replicas": 1 if min_replicas is None else int(min_replicas),
            "max_replicas": int(max_replicas or max(min_replicas or 1, 2)),
            "target_ongoing_requests": float(target_ongoing_requests or 16),
        }
    elif num_replicas is not None:
        options["num_replicas"] = int(num_replicas)
    if num_cpus is not None:
        options["ray_actor_options"] = {"num_cpus": float(num_cpus)}
    # Each replica takes up to max_slots + max_queue requests; more go to another replica.
    options["max_ongoing_requests"] = int(max_ongoing_requests or 64)
    return options


def build_app(args: dict[str, Any]) -> Any:
    """A Ray Serve application (for ``serve.run`` or ``serve run module:build_app k=v``).

    ``args``: ``model`` (folder, required; every node needs it at that path), Ray options
    (``num_replicas``, or ``min_replicas`` / ``max_replicas`` / ``target_ongoing_requests``
    for autoscaling, ``num_cpus`` per replica, ``max_ongoing_requests``, ``name``), and
    `ServeEngine` options (``threads``, ``max_slots``, ``max_queue``, ``request_timeout``,
    ``prefill_chunk``, ``prefix_cache_mb``, ``model_name``, ``lanes``: default 1 per replica;
    ``provider`` and ``provider_options``, a mapping or ``"KEY=VALUE,..."``),
    and the HTTP options ``api_key``, ``allowed_origins`` (a list, or a comma-separated string)
    ``max_body_bytes``, ``webui`` (the chat page at /; "false" or "0" turn it off) and
    ``allow_remote_images`` (see `genai.serve.app.create_app`). Values may be strings (from
    the command line).
    """
    args = dict(args)
    model = args.pop("model", None)
    if not model:
        raise ValueError("build_app needs args['model'], the model folder")
    name = str(args.pop("name", "genai"))
    api_key = args.pop("api_key", None)
    limit = args.pop("max_body_bytes", None)
    max_body_bytes = None if limit is None else int(_number(limit))
    remote_images = _flag(args.pop("allow_remote_images", False))
    webui = _flag(args.pop("webui", True))
    origins = args.pop("allowed_origins", ())
    if isinstance(origins, str):
        origins = [o.strip() for o in origins.split(",") if o.strip()]
    engine: dict[str, Any] = {}
    for key in ENGINE_OPTIONS:
        if key in args:
            value = args.pop(key)
            if key in _FLAG_OPTIONS:
                engine[key] = _flag(value)
            elif key == "provider_options":
                engine[key] = _pairs(value)
            else:
                engine[key] = value if key in _TEXT_OPTIONS else _number(value)
    ray_options = {
        k: _number(v) if k != "num_replicas" or v != "auto" else v for k, v in args.items()
    }
    options = deployment_options(**ray_options)
    if "threads" in engine and "ray_actor_options" not in options:
        options["ray_actor_options"] = {"num_cpus": float(engine["threads"])}
    deployment = serve.deployment(GenaiReplica, name=name, **options)
    key = None if api_key is None else str(api_key)
    return deployment.bind(
        str(model), engine, key, tuple(origins), max_body_bytes, webui, remote_images
    )


def _pairs(value: Any) -> dict[str, str]:
    """``provider_options``: a mapping, or ``"KEY=VALUE,KEY=VALUE"`` from the command line."""
    if isinstance(value, str):
        pairs = [item.partition("=") for item in value.split(",") if item.strip()]
        if any(not sep or not key.strip() for key, sep, _ in pairs):
            raise ValueError(f"provider_options expects KEY=VALUE,..., got {value!r}")
        return {key.strip(): text.strip() for key, _, text in pairs}
    return {str(key): str(text) for key, text in dict(value).items()}


def _flag(value: Any) -> bool:
    """A boolean option, from the command line's strings too ("false", "0", "no", "off")."""
    if isinstance(value, str):
        return value.strip().lower() not in ("false", "0", "no", "off", "")
    return bool(value)


def _number(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return float(value)
    return value
