"""``genai serve``: the OpenAI-compatible HTTP server (or a Ray Serve deployment)."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from pathlib import Path
from types import SimpleNamespace

from genai.cli.common import (
    UsageError,
    add_model_option,
    load_model,
    provider_choice,
    resolve_model_arg,
)
from genai.cli.registry import command
from genai.errors import MissingDependencyError
from genai.runtime.model import Model
from genai.serve.speculative import SpeculativeServing

__all__: list[str] = []


@command("serve", "serve an OpenAI-compatible HTTP API with continuous batching")
def _fill_serve(serve: argparse.ArgumentParser) -> None:
    serve.description = (
        "Serve /v1/chat/completions, /v1/completions, /v1/models, /health and /metrics "
        "(needs the 'serve' extra: pip install 'genai-runtime[serve]'). See docs/serving.md."
    )
    add_model_option(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    serve.add_argument("--served-model-name", metavar="NAME", help="model id of the API")
    serve.add_argument(
        "--max-slots",
        type=int,
        default=16,
        metavar="N",
        help="sequences held at once (KV slots, split over the lanes)",
    )
    serve.add_argument(
        "--max-queue", type=int, default=64, metavar="N", help="waiting requests before 429"
    )
    serve.add_argument(
        "--timeout", type=float, default=600.0, metavar="S", help="request timeout in seconds"
    )
    serve.add_argument(
        "--prefill-chunk", type=int, default=64, metavar="N", help="prompt tokens per step"
    )
    serve.add_argument(
        "--prefix-cache-mb", type=int, default=256, metavar="MB", help="prompt-prefix KV cache"
    )
    serve.add_argument("--threads", type=int, metavar="N", help="ORT intra-op threads")
    serve.add_argument(
        "--whisper",
        metavar="DIR",
        help="also serve this Whisper model folder at /v1/audio/transcriptions",
    )
    serve.add_argument(
        "--switch-interval",
        type=float,
        default=0.0,
        metavar="S",
        help="set Python's GIL switch interval (default: keep Python's 0.005)",
    )
    serve.add_argument(
        "--lanes",
        type=int,
        metavar="N",
        help="schedulers side by side, each with its own share of the slots and its own "
        "model runs; default: CPUs / intra-op threads, at most 4 (env GENAI_SERVE_LANES)",
    )
    serve.add_argument(
        "--no-overlap",
        action="store_true",
        help="with one lane, run prefill chunks and decode steps one after the other "
        "(default: at the same time, on two threads); several lanes never overlap them",
    )
    serve.add_argument(
        "--api-key",
        default=os.environ.get("GENAI_API_KEY"),
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' on the /v1 endpoints (default: env "
        "GENAI_API_KEY; unset or empty: no key, with a warning for an empty one); /health and "
        "/metrics stay open, /docs, /redoc and /openapi.json are off",
    )
    serve.add_argument(
        "--max-body-bytes",
        type=int,
        metavar="N",
        help="larger request bodies get HTTP 413 (default: 4 MiB; 32 MiB for a model that takes "
        "images or audio)",
    )
    serve.add_argument(
        "--allowed-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="let web pages of ORIGIN (e.g. http://localhost:3000, or '*') call the API from "
        "a browser (CORS); repeatable",
    )
    serve.add_argument(
        "--no-webui",
        action="store_true",
        help="do not serve the chat page at / (docs/webui.md); the API is the same either way",
    )
    serve.add_argument(
        "--allow-remote-images",
        action="store_true",
        help="fetch http(s) image URLs of chat messages (vision-language models; default: "
        "only data: URLs, a remote URL is a 400)",
    )
    serve.add_argument(
        "--speculative",
        metavar="ngram[:N[:K]]|draft:DIR",
        help="speculative decoding: each step verifies up to K (default 4) proposed tokens in "
        "one run per sequence, from prompt lookup (the tokens that followed the last N-1, "
        "default N 3, tokens earlier in the sequence) or a draft model folder DIR of the "
        "same vocabulary; same tokens as without it on exact graphs; a request's "
        '"speculative": false opts out; a folder that cannot verify serves plainly',
    )
    serve.add_argument(
        "--speculative-max-streams",
        type=int,
        default=1,
        metavar="N",
        help="speculate only while at most N sequences of a lane are decoding (default 1: "
        "each speculating sequence takes a model run of its own, the plain step one for all)",
    )
    serve.add_argument(
        "--speculative-backoff",
        action="store_true",
        help="a sequence pauses its verify runs while they are slower than its plain steps "
        "(off by default: served verify runs paid on every prompt measured, docs/serving.md)",
    )
    serve.add_argument(
        "--single-row-steps",
        action="store_true",
        help="a decode step with one sequence decoding runs one row (faster for a lone "
        "stream; its tokens then follow the generator's one-row steps, and may differ in the "
        "last bits from the same request served beside others); default: at least two rows, "
        "so that a request's tokens never depend on what else runs",
    )
    serve.add_argument(
        "--shutdown-timeout",
        type=float,
        default=5.0,
        metavar="S",
        help="after Ctrl-C or SIGTERM, seconds open requests (streams) may take to finish "
        "before they are cut (default 5; a second Ctrl-C cuts them at once)",
    )
    serve.add_argument(
        "--log-level", default="info", help=f"uvicorn log level: {', '.join(LOG_LEVELS)}"
    )
    ray = serve.add_argument_group("Ray Serve (scale-out; needs the 'ray' extra)")
    ray.add_argument("--ray", action="store_true", help="run as a Ray Serve deployment")
    ray.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="Ray cluster to join (e.g. 'auto' on a node of a running cluster; "
        "default: start a local head)",
    )
    ray.add_argument("--replicas", type=int, metavar="N", help="fixed replica count (default 1)")
    ray.add_argument("--min-replicas", type=int, metavar="N", help="autoscaling lower bound")
    ray.add_argument("--max-replicas", type=int, metavar="N", help="autoscaling upper bound")
    serve.set_defaults(handler=_serve)


#: uvicorn's log levels.
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")

#: Numeric flags and their bounds: (attribute, lowest allowed, highest allowed or None, lowest
#: excluded); a flag left unset (None) is not checked.
_BOUNDS: tuple[tuple[str, float, float | None, bool], ...] = (
    ("port", 0, 65535, False),
    ("max_slots", 1, None, False),
    ("max_queue", 0, None, False),
    ("timeout", 0, None, True),
    ("prefill_chunk", 1, None, False),
    ("prefix_cache_mb", 0, None, False),
    ("threads", 1, None, False),
    ("switch_interval", 0, None, False),
    ("lanes", 1, None, False),
    ("max_body_bytes", 1, None, False),
    ("speculative_max_streams", 1, None, False),
    ("shutdown_timeout", 0, None, False),
    ("replicas", 1, None, False),
    ("min_replicas", 1, None, False),
    ("max_replicas", 1, None, False),
)


def check_serve_flags(args: argparse.Namespace) -> None:
    """Refuse out-of-range flags, and Ray flags without ``--ray`` (`UsageError` naming the
    flag), before any model loads."""
    for name, low, high, low_excluded in _BOUNDS:
        value = getattr(args, name)
        if value is None:
            continue
        flag = "--" + name.replace("_", "-")
        if value != value or (value <= low if low_excluded else value < low):  # NaN too
            relation = ">" if low_excluded else ">="
            raise UsageError(f"{flag} must be {relation} {low:g}, got {value}")
        if high is not None and value > high:
            raise UsageError(f"{flag} must be <= {high:g}, got {value}")
    if args.log_level.lower() not in LOG_LEVELS:
        raise UsageError(f"--log-level {args.log_level!r}: expected one of {', '.join(LOG_LEVELS)}")
    args.log_level = args.log_level.lower()
    if not args.ray:
        for name in ("ray_address", "replicas", "min_replicas", "max_replicas"):
            if getattr(args, name) is not None:
                raise UsageError(f"--{name.replace('_', '-')} needs --ray")
    if args.min_replicas and args.max_replicas and args.min_replicas > args.max_replicas:
        raise UsageError(
            f"--min-replicas {args.min_replicas} exceeds --max-replicas {args.max_replicas}"
        )


def _serve_ray(args: argparse.Namespace) -> int:
    try:  # lazy: ray is the optional 'ray' extra
        import ray
        from ray import serve

        from genai.serve.ray_serve import build_app
    except ImportError as exc:
        raise MissingDependencyError(
            f"genai serve --ray needs the 'ray' extra (pip install 'genai-runtime[ray]'): {exc}"
        ) from exc
    choice = provider_choice(args)
    label = resolve_model_arg(args)
    options: dict[str, object] = {
        "model": str(Path(args.model).resolve()),
        "max_slots": args.max_slots,
        "max_queue": args.max_queue,
        "request_timeout": args.timeout,
        "prefill_chunk": args.prefill_chunk,
        "prefix_cache_mb": args.prefix_cache_mb,
    }
    if args.speculative:  # each replica loads a draft folder itself
        options["speculative"] = args.speculative
        options["speculative_max_streams"] = args.speculative_max_streams
        if args.speculative_backoff:
            options["speculative_backoff"] = True
    if args.single_row_steps:
        options["single_row_steps"] = True
    if args.api_key:
        options["api_key"] = args.api_key
    if args.max_body_bytes is not None:
        options["max_body_bytes"] = args.max_body_bytes
    if args.allowed_origin:
        options["allowed_origins"] = list(args.allowed_origin)
    if args.no_webui:
        options["webui"] = False
    if args.allow_remote_images:
        options["allow_remote_images"] = True
    if args.served_model_name or label:  # a cached model: the name -m gave
        options["model_name"] = args.served_model_name or label
    if choice is not None:
        options["provider"], options["provider_options"] = choice
    if args.threads is not None:
        options["threads"] = args.threads
    if args.min_replicas is not None or args.max_replicas is not None:
        options["min_replicas"] = args.min_replicas or 1
        options["max_replicas"] = args.max_replicas or max(args.min_replicas or 1, 2)
    else:
        options["num_replicas"] = args.replicas or 1
    ray.init(address=args.ray_address)
    serve.start(http_options={"host": args.host, "port": args.port})
    print(
        f"genai serve --ray: {options['model']} on http://{args.host}:{args.port}/v1",
        file=sys.stderr,
    )
    serve.run(build_app(options), name="genai", route_prefix="/", blocking=True)
    return 0


def _serve(args: argparse.Namespace) -> int:
    check_serve_flags(args)
    speculative = None
    if args.speculative:
        speculative = SpeculativeServing.parse(
            args.speculative, args.speculative_max_streams, args.speculative_backoff
        )
    if args.ray:
        return _serve_ray(args)
    serving = _serving_modules()
    sock = serving.listen(args.host, args.port)  # a taken port: reported before any load
    try:
        if speculative is not None:  # a draft folder
            speculative = speculative.loaded(lambda folder: Model(str(Path(folder).resolve())))
        stopped_by = _serve_model(args, speculative, serving, sock)
    finally:
        sock.close()
    return 130 if stopped_by == signal.SIGINT else 0  # Ctrl-C: 130, as the other commands


def _serving_modules() -> SimpleNamespace:
    """The serve extra's parts: ``ServeEngine``, ``listen``, ``run_server``."""
    try:  # lazy: fastapi and uvicorn are the optional 'serve' extra
        from genai.serve.app import ServeEngine
        from genai.serve.server import listen, run_server
    except ImportError as exc:
        raise MissingDependencyError(
            f"genai serve needs the 'serve' extra (pip install 'genai-runtime[serve]'): {exc}"
        ) from exc
    return SimpleNamespace(ServeEngine=ServeEngine, listen=listen, run_server=run_server)


def _serve_model(
    args: argparse.Namespace,
    speculative: SpeculativeServing | None,
    serving: SimpleNamespace,
    sock: socket.socket,
) -> int | None:
    """Load the model and serve it on ``sock``; returns the signal that stopped the server."""
    _, model, tokenizer = load_model(args, speech=True)  # a Whisper -m: /v1/audio only
    engine = serving.ServeEngine(
        model,
        tokenizer,
        model_name=args.served_model_name or args.model_label,
        max_slots=args.max_slots,
        max_queue=args.max_queue,
        request_timeout=args.timeout,
        prefill_chunk=args.prefill_chunk,
        prefix_cache_mb=args.prefix_cache_mb,
        switch_interval=args.switch_interval or None,
        overlap_prefill=not args.no_overlap,
        lanes=args.lanes,
        speculative=speculative,
        single_row_steps=args.single_row_steps,
    )
    # a runner that cannot verify serves plainly (the scheduler logs why)
    speculates = speculative is not None and engine.runner.verify_tokens >= 2
    if engine.images is not None:
        engine.images.allow_remote = args.allow_remote_images
    if args.whisper or model.encoder is not None:
        from genai.serve.transcriptions import SpeechService  # lazy: the serve extra (fastapi)

        engine.speech = (
            SpeechService.from_path(args.whisper, threads=args.threads)
            if args.whisper
            else SpeechService(model, name=engine.model_name)  # -m is the Whisper model
        )
    # the address bound (--port 0: the port the system chose; uvicorn logs none for a socket)
    host = f"[{args.host}]" if ":" in args.host else args.host
    base = f"http://{host}:{sock.getsockname()[1]}"
    print(
        f"genai serve: {engine.model_name} on {base}/v1 "
        f"({type(engine.runner).__name__}, {args.max_slots} slots"
        + (f", speculative {args.speculative}" if speculates else "")
        + ")"
        + ("" if args.no_webui else f"; chat page at {base}/"),
        file=sys.stderr,
    )
    http: dict[str, int] = {}
    if args.max_body_bytes is not None:
        http["max_body_bytes"] = args.max_body_bytes
    return serving.run_server(
        engine,
        args.host,
        args.port,
        log_level=args.log_level,
        api_key=args.api_key,
        allowed_origins=args.allowed_origin,
        webui=not args.no_webui,
        shutdown_timeout=args.shutdown_timeout,
        sock=sock,
        **http,
    )
