"""The ``genai`` command line (also ``python -m genai``).

genai [-v | -vv] COMMAND ...   (before the command: log genai's INFO / DEBUG records to stderr)
genai generate [-m MODEL_DIR] "prompt" [--chat] [--max-length N] [--threads N] [-v]
genai chat [-m MODEL_DIR] [--system TEXT] [--max-new-tokens N] [--threads N] [-v]
genai build INPUT -o OUT [--precision int4|fp16|fp32] [--all-logits]
genai pull [--force] [-q]
genai providers [--json] [--devices] [--plugins]
genai conformance PROVIDER [--model DIR] [--report FILE.json] [-o KEY=VALUE]... [--xfails FILE]
genai serve [-m MODEL_DIR] [--host 127.0.0.1] [--port 8000] [--max-slots N] [--threads N] ...

Plugins add subcommands through the ``register_commands`` hook.

The top-level ``-v``/``--verbose`` (given before the command) configures the standard-library
``genai`` logger: its INFO records (``-vv``: DEBUG too) go to stderr while the command runs.
It is not the subcommands' own ``-v`` (after the command): ``generate -v`` and ``chat -v``
print speeds, ``conformance -v`` makes pytest verbose.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import genai
from genai._version import __version__
from genai.errors import GenaiError, InvalidArgumentError, MissingDependencyError
from genai.providers import PluginEPProvider, get_provider_class, list_providers, plugins

__all__ = ["main"]

DEFAULT_NEW_TOKENS = 256

log = logging.getLogger(__name__)

#: Format of the records ``genai -v`` writes to stderr.
LOG_FORMAT = "genai: %(levelname)s %(name)s: %(message)s"


#: Prompts at least this long show a prefill progress line (when stderr is a terminal).
PREFILL_PROGRESS_TOKENS = 1024
#: Tokens per prefill step while a progress line is shown.
PREFILL_CHUNK = 512

#: The built-in commands: name -> (one-line help, function that fills its subparser). Only the
#: command being run is filled in, so that ``genai --help`` and ``genai generate`` import no
#: builder (onnx) and scan no plugins; plugins are scanned only for a command that is not here.
_COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {}


def _command(name: str, help: str):
    def register(fill: Callable[[argparse.ArgumentParser], None]):
        _COMMANDS[name] = (help, fill)
        return fill

    return register


def _command_name(argv: Sequence[str] | None) -> str | None:
    """The command word of ``argv``: its first argument that is not an option."""
    for arg in argv or ():
        if not arg.startswith("-"):
            return arg
    return None


def _build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``genai`` parser, with the command of ``argv`` (none: no command) filled in."""
    selected = _command_name(argv)
    parser = argparse.ArgumentParser(
        prog="genai",
        description="Run generative ONNX models (onnxruntime-genai model folders).",
        epilog="Plugins may add commands: `genai providers --plugins` lists the plugins; "
        "`genai COMMAND --help` describes a command.",
    )
    parser.add_argument("--version", action="version", version=f"genai {__version__}")
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        dest="log_verbosity",
        help="log genai's INFO records to stderr (-vv: DEBUG too); give it before COMMAND "
        "(a command's own -v, after it, is that command's option)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help_text, fill) in _COMMANDS.items():
        sub = commands.add_parser(name, help=help_text)
        if name == selected:
            fill(sub)
    if selected is not None and selected not in _COMMANDS:
        plugins.hook().register_commands(commands=commands)
    return parser


def _add_length_options(parser: argparse.ArgumentParser, default_new: int | None) -> None:
    lengths = parser.add_mutually_exclusive_group()
    lengths.add_argument(
        "--max-length",
        type=int,
        metavar="N",
        help="total tokens, prompt (the whole conversation, for chat) included; "
        "at most the model's context length",
    )
    lengths.add_argument(
        "--max-new-tokens",
        type=int,
        default=default_new,
        metavar="N",
        help=f"new tokens per reply (default {DEFAULT_NEW_TOKENS}, within the context length)",
    )


def _check_lengths(args: argparse.Namespace) -> None:
    for flag in ("max_length", "max_new_tokens"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise InvalidArgumentError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")


@_command("generate", "generate text from a prompt, streaming it to stdout")
def _fill_generate(gen: argparse.ArgumentParser) -> None:
    gen.description = "Generate text from a prompt (greedy), streaming it as it is produced."
    gen.add_argument("prompt", help="the prompt text ('-' reads it from stdin)")
    gen.add_argument(
        "-m",
        "--model",
        metavar="DIR",
        help="model folder (default: the default model, SmolLM2-135M-Instruct int4, "
        "pulled on first use)",
    )
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    gen.add_argument("--system", metavar="TEXT", help="system message (with --chat)")
    _add_length_options(gen, None)
    gen.add_argument("--threads", type=int, metavar="N", help="ORT intra-op threads")
    _add_adapter_option(gen)
    gen.add_argument(
        "-v", "--verbose", action="store_true", help="print prefill ms and decode tok/s to stderr"
    )
    gen.set_defaults(handler=_generate)


@_command("chat", "chat with a model in the terminal (multi-turn, streaming)")
def _fill_chat(chat: argparse.ArgumentParser) -> None:
    chat.description = (
        "A multi-turn chat: each line you type is a user message; the reply streams as it is "
        "produced. The conversation's KV cache is reused between turns. Commands: "
        + "; ".join(f"{c} {h}" for c, h in CHAT_COMMANDS)
        + ". Ctrl-C stops a reply; Ctrl-D or /exit ends the chat."
    )
    chat.add_argument(
        "-m",
        "--model",
        metavar="DIR",
        help="model folder (default: the default model, pulled on first use)",
    )
    chat.add_argument("--system", metavar="TEXT", help="system message")
    _add_length_options(chat, None)
    chat.add_argument("--threads", type=int, metavar="N", help="ORT intra-op threads")
    _add_adapter_option(chat)
    chat.add_argument("-v", "--verbose", action="store_true", help="print tok/s per reply")
    chat.set_defaults(handler=_chat)


@_command("adapter", "LoRA adapter tools (convert a PEFT adapter to .onnx_adapter)")
def _fill_adapter(adapter: argparse.ArgumentParser) -> None:
    # lazy: the builder imports onnx, needed only by this command
    from genai.builder.peft import CONVERT_DESCRIPTION, add_convert_arguments

    adapter.description = "LoRA adapter tools."
    adapter_commands = adapter.add_subparsers(dest="adapter_command", metavar="ACTION")
    adapter_commands.required = True
    convert = adapter_commands.add_parser(
        "convert",
        help="convert a PEFT LoRA adapter folder into an .onnx_adapter file",
        description=CONVERT_DESCRIPTION,
    )
    add_convert_arguments(convert)
    convert.set_defaults(handler=_adapter_convert, parser=convert)


@_command("providers", "list execution providers, their packages, and whether they can run here")
def _fill_providers(prov: argparse.ArgumentParser) -> None:
    prov.description = (
        "List every registered execution provider with the package that provides it and "
        "whether it can run here (or why not). Probes are cheap: nothing is loaded unless "
        "--devices is given."
    )
    prov.add_argument("--json", action="store_true", help="print JSON")
    prov.add_argument(
        "--devices",
        action="store_true",
        help="also load each available plugin EP library and list its devices",
    )
    prov.add_argument("--plugins", action="store_true", help="also list the loaded plugins")
    prov.set_defaults(handler=_providers)


@_command("conformance", "run the provider conformance suite and print a pass/fail/skip table")
def _fill_conformance(conf: argparse.ArgumentParser) -> None:
    conf.description = (
        "Run the execution-provider conformance suite (tiny models it builds itself, or "
        "--model) against PROVIDER. Exit status 0 when nothing failed."
    )
    conf.add_argument("provider", help="provider name (as in genai_config.json)")
    conf.add_argument("--model", metavar="DIR", help="model folder instead of the tiny models")
    conf.add_argument("--report", metavar="FILE.json", help="write the results as JSON")
    conf.add_argument(
        "-o",
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="provider option (repeatable)",
    )
    conf.add_argument("--xfails", metavar="FILE", help="test names to mark xfail, one a line")
    conf.add_argument("-v", "--verbose", action="store_true", help="pytest's verbose output")
    conf.set_defaults(handler=_conformance)


@_command("build", "build a model folder from a GGUF file or a Hugging Face folder")
def _fill_build(build: argparse.ArgumentParser) -> None:
    from genai.builder.cli import add_build_arguments  # lazy: the builder imports onnx

    add_build_arguments(build)


@_command("pull", "fetch and build the default model (SmolLM2-135M-Instruct int4)")
def _fill_pull(pull: argparse.ArgumentParser) -> None:
    from genai.builder.cli import add_pull_arguments  # lazy: the builder imports onnx

    add_pull_arguments(pull)


@_command("serve", "serve an OpenAI-compatible HTTP API with continuous batching")
def _fill_serve(serve: argparse.ArgumentParser) -> None:
    serve.description = (
        "Serve /v1/chat/completions, /v1/completions, /v1/models, /health and /metrics "
        "(needs the 'serve' extra: pip install 'genai-runtime[serve]'). See docs/serving.md."
    )
    serve.add_argument(
        "-m",
        "--model",
        metavar="DIR",
        help="model folder (default: the default model, pulled on first use)",
    )
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
        help="larger request bodies get HTTP 413 (default: 4 MiB)",
    )
    serve.add_argument(
        "--allowed-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="let web pages of ORIGIN (e.g. http://localhost:3000, or '*') call the API from "
        "a browser (CORS); repeatable",
    )
    serve.add_argument("--log-level", default="info", help="uvicorn log level")
    ray = serve.add_argument_group("Ray Serve (scale-out; needs the 'ray' extra)")
    ray.add_argument("--ray", action="store_true", help="run as a Ray Serve deployment")
    ray.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="Ray cluster to join (e.g. 'auto' on a node of a running cluster; "
        "default: start a local head)",
    )
    ray.add_argument("--replicas", type=int, default=1, metavar="N", help="fixed replica count")
    ray.add_argument("--min-replicas", type=int, metavar="N", help="autoscaling lower bound")
    ray.add_argument("--max-replicas", type=int, metavar="N", help="autoscaling upper bound")
    serve.set_defaults(handler=_serve)


def _serve_ray(args: argparse.Namespace) -> int:
    try:  # lazy: ray is the optional 'ray' extra
        import ray
        from ray import serve

        from genai.serve.ray_serve import build_app
    except ImportError as exc:
        raise MissingDependencyError(
            f"genai serve --ray needs the 'ray' extra (pip install 'genai-runtime[ray]'): {exc}"
        ) from exc
    if args.model is None:
        args.model = str(_default_model())
    options: dict[str, object] = {
        "model": str(Path(args.model).resolve()),
        "max_slots": args.max_slots,
        "max_queue": args.max_queue,
        "request_timeout": args.timeout,
        "prefill_chunk": args.prefill_chunk,
        "prefix_cache_mb": args.prefix_cache_mb,
    }
    if args.api_key:
        options["api_key"] = args.api_key
    if args.max_body_bytes is not None:
        options["max_body_bytes"] = args.max_body_bytes
    if args.allowed_origin:
        options["allowed_origins"] = list(args.allowed_origin)
    if args.served_model_name:
        options["model_name"] = args.served_model_name
    if args.threads is not None:
        options["threads"] = args.threads
    if args.min_replicas is not None or args.max_replicas is not None:
        options["min_replicas"] = args.min_replicas or 1
        options["max_replicas"] = args.max_replicas or max(args.min_replicas or 1, 2)
    else:
        options["num_replicas"] = args.replicas
    ray.init(address=args.ray_address)
    serve.start(http_options={"host": args.host, "port": args.port})
    print(
        f"genai serve --ray: {options['model']} on http://{args.host}:{args.port}/v1",
        file=sys.stderr,
    )
    serve.run(build_app(options), name="genai", route_prefix="/", blocking=True)
    return 0


def _serve(args: argparse.Namespace) -> int:
    if args.ray:
        return _serve_ray(args)
    try:  # lazy: fastapi and uvicorn are the optional 'serve' extra
        from genai.serve.app import ServeEngine
        from genai.serve.server import run_server
    except ImportError as exc:
        raise MissingDependencyError(
            f"genai serve needs the 'serve' extra (pip install 'genai-runtime[serve]'): {exc}"
        ) from exc
    _, model, tokenizer = _load(args)
    engine = ServeEngine(
        model,
        tokenizer,
        model_name=args.served_model_name,
        max_slots=args.max_slots,
        max_queue=args.max_queue,
        request_timeout=args.timeout,
        prefill_chunk=args.prefill_chunk,
        prefix_cache_mb=args.prefix_cache_mb,
        switch_interval=args.switch_interval or None,
        overlap_prefill=not args.no_overlap,
        lanes=args.lanes,
    )
    print(
        f"genai serve: {engine.model_name} on http://{args.host}:{args.port}/v1 "
        f"({type(engine.runner).__name__}, {args.max_slots} slots)",
        file=sys.stderr,
    )
    http: dict[str, int] = {}
    if args.max_body_bytes is not None:
        http["max_body_bytes"] = args.max_body_bytes
    run_server(
        engine,
        args.host,
        args.port,
        log_level=args.log_level,
        api_key=args.api_key,
        allowed_origins=args.allowed_origin,
        **http,
    )
    return 0


def _providers(args: argparse.Namespace) -> int:
    rows = list_providers()
    registered = {r.name.lower() for r in rows}
    missing = [
        (name, package, runtime)
        for key, (name, package, runtime) in plugins.KNOWN_PROVIDER_PACKAGES.items()
        if key not in registered
    ]
    devices: dict[str, object] = {}
    if args.devices:
        for row in rows:
            cls = get_provider_class(row.name)
            if row.available and issubclass(cls, PluginEPProvider):
                try:
                    devices[row.name] = [d.as_dict() for d in cls().probe_devices()]
                except Exception as exc:
                    devices[row.name] = f"error: {exc}"
    if args.json:
        document = {
            "providers": [
                {**r.as_dict(), **({"devices": devices[r.name]} if r.name in devices else {})}
                for r in rows
            ],
            "not_installed": [
                {
                    "name": key,
                    "package": package,
                    "runtime": runtime,
                    "install": plugins.provider_install_command(key.lower()),
                }
                for key, package, runtime in missing
            ],
        }
        if args.plugins:
            document["plugins"] = [vars(p) for p in plugins.list_plugins()]
        print(json.dumps(document, indent=2, default=list))
        return 0
    width = max(len(name) for name in [*(r.name for r in rows), *(m[0] for m in missing)])
    pwidth = max(len(pkg) for pkg in [*(r.package for r in rows), *(m[1] for m in missing)])
    for r in rows:
        status = "available" if r.available else f"unavailable: {r.reason}"
        print(f"{r.name:<{width}}  {r.package:<{pwidth}}  {status}")
        if r.name in devices:
            found = devices[r.name]
            if isinstance(found, str):
                print(f"{'':<{width}}  devices: {found}")
            else:
                for d in found:  # type: ignore[union-attr]
                    print(f"{'':<{width}}  device: {d['device_type']} {d['vendor']} "
                          f"(id {d['device_id']})")  # fmt: skip
    for key, package, runtime in missing:
        command = plugins.provider_install_command(key.lower())
        print(f"{key:<{width}}  {package:<{pwidth}}  not installed ({command}; "
              f"needs {runtime})")  # fmt: skip
    if args.plugins:
        print()
        for p in plugins.list_plugins():
            origin = "built-in" if p.builtin else f"{p.distribution} {p.version}".strip()
            print(f"plugin {p.name}: {p.module} ({origin}); hooks: {', '.join(p.hooks)}")
    return 0


def _conformance(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("pytest") is None:
        raise MissingDependencyError(
            "genai conformance needs the 'conformance' extra "
            "(pip install 'genai-runtime[conformance]'): pytest is not installed"
        )
    try:  # lazy: pytest is the optional 'conformance' extra
        from genai.testing.conformance import run_conformance
    except ImportError as exc:
        raise MissingDependencyError(
            f"genai conformance needs the 'conformance' extra "
            f"(pip install 'genai-runtime[conformance]'): {exc}"
        ) from exc
    options = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidArgumentError(f"--option expects KEY=VALUE, got {item!r}")
        options[key] = value
    code, results = run_conformance(
        args.provider,
        options=options,
        model=args.model,
        report=args.report,
        xfails=args.xfails,
        quiet=not args.verbose,
    )
    if not results:  # nothing ran (the plugin prints the table otherwise)
        print(f"genai conformance {args.provider}: no conformance test ran (pytest exit {code})")
    failed = any(r["outcome"] in ("fail", "error") for r in results)
    return 1 if failed or code not in (0, 5) or not results else 0


def _default_model() -> Path:
    """The default model folder, pulled and built on first use (progress on stderr)."""
    from genai.builder.pull import ensure_default_model  # lazy: the builder imports onnx

    return ensure_default_model(progress=True)


def _load(args: argparse.Namespace):
    """Config, model and tokenizer for ``-m`` (or the default model) and ``--threads``."""
    if args.model is None:
        args.model = str(_default_model())
    path = Path(args.model)
    if path.is_file() and path.suffix.lower() == ".gguf":
        raise InvalidArgumentError(
            f"-m {args.model} is a GGUF file, not a model folder: build it first with "
            f"`genai build {args.model} -o DIR`, then use -m DIR"
        )
    config = genai.Config(args.model)
    if args.threads is not None:
        if args.threads < 1:
            raise InvalidArgumentError("--threads must be >= 1")
        config.overlay({"model": {"decoder": {"session_options": {
            "intra_op_num_threads": args.threads}}}})  # fmt: skip
    model = genai.Model(config)
    return config, model, genai.Tokenizer(model)


def _add_adapter_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--adapter",
        action="append",
        default=[],
        metavar="FILE[=NAME]",
        help="activate a LoRA .onnx_adapter file (repeatable; several add up)",
    )


def _activate_adapters(model, generator, specs: list[str]) -> None:
    """Load each ``FILE[=NAME]`` of ``--adapter`` and activate it on ``generator``."""
    if not specs:
        return
    adapters = genai.Adapters(model)
    for spec in specs:
        path, sep, name = spec.partition("=")
        name = name if sep else Path(path).stem
        adapters.load(path, name)
        generator.set_active_adapter(adapters, name)  # the generator keeps the bound weights


def _adapter_convert(args: argparse.Namespace) -> int:
    from genai.builder.peft import run_convert  # lazy: the builder imports onnx

    return run_convert(args.parser, args)


#: The chat's own commands (a line starting with "/"), as /help lists them.
CHAT_COMMANDS: tuple[tuple[str, str], ...] = (
    ("/help", "lists these commands"),
    ("/reset", "starts the conversation again (keeps the system message)"),
    ("/system TEXT", "sets the system message and starts again (/system alone: none)"),
    ("/exit", "ends the chat (as Ctrl-D does)"),
)


def _chat_help() -> str:
    width = max(len(c) for c, _ in CHAT_COMMANDS)
    lines = [f"  {c:<{width}}  {h}" for c, h in CHAT_COMMANDS]
    lines.append("  Ctrl-C stops a reply; start a message with // to send one beginning with /")
    return "\n".join(lines)


def _read_line(interactive: bool) -> str | None:
    """The next line the user typed (without its newline), or None at the end of input.
    On a terminal, ``input`` edits the line with readline (arrows, history)."""
    if interactive:
        try:
            return input("> ")
        except EOFError:
            sys.stdout.write("\n")  # Ctrl-D: leave the shell's prompt on a line of its own
            sys.stdout.flush()
            return None
    line = sys.stdin.readline()
    return line.rstrip("\n") if line else None


def _enable_line_editing() -> None:
    """Line editing and history for ``input`` where the standard library has readline."""
    with contextlib.suppress(ImportError):  # e.g. Windows without pyreadline
        import readline  # noqa: F401  (importing it is what turns editing on)


def _chat(args: argparse.Namespace) -> int:
    _check_lengths(args)
    max_new = args.max_new_tokens or DEFAULT_NEW_TOKENS
    config, model, tokenizer = _load(args)
    context = config.context_length
    if args.max_length is not None and args.max_length > context:
        raise InvalidArgumentError(
            f"--max-length {args.max_length} exceeds the model's context length ({context})"
        )
    limit = args.max_length or context
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=limit)
    generator = genai.Generator(model, params)
    _activate_adapters(model, generator, args.adapter)
    system = args.system
    messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    interactive = sys.stdin.isatty()
    if interactive:
        _enable_line_editing()
    out = sys.stdout
    print("genai chat: /help lists commands; Ctrl-C stops a reply; /exit or Ctrl-D leaves.",
          file=sys.stderr)  # fmt: skip
    while True:
        try:
            line = _read_line(interactive)
        except KeyboardInterrupt:  # Ctrl-C at the prompt: a fresh prompt, as a shell does
            out.write("\n")
            continue
        if line is None:
            return 0
        text = line.strip()
        if not text:
            continue
        if text.startswith("/") and not text.startswith("//"):
            command, _, rest = text.partition(" ")
            if command in ("/exit", "/quit"):
                return 0
            if command == "/help":
                print(_chat_help(), file=out)
            elif command in ("/reset", "/system"):
                if command == "/system":
                    system = rest.strip() or None
                messages = [{"role": "system", "content": system}] if system else []
                print("(conversation reset)", file=sys.stderr)
            else:
                print(f"unknown command {command}; /help lists the commands", file=sys.stderr)
            continue
        content = line[1:] if text.startswith("//") else line
        messages.append({"role": "user", "content": content})
        prompt = tokenizer.encode(
            tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        )
        if len(prompt) + 1 > limit:
            messages.pop()
            what = "--max-length" if args.max_length else "the model's context length"
            print(f"genai: the conversation ({len(prompt)} tokens) no longer fits {what} "
                  f"({limit} tokens); /reset starts again", file=sys.stderr)  # fmt: skip
            continue
        # Reuse the KV cache: keep the common prefix with what the model has seen, feed the rest.
        seen = generator.get_sequence(0) if generator.token_count() else prompt[:0]
        common = 0
        shared = min(len(seen), len(prompt) - 1)
        while common < shared and seen[common] == prompt[common]:
            common += 1
        if common < generator.token_count():
            generator.rewind_to(common)
        reply: list[int] = []
        started = time.perf_counter()
        try:
            _prefill(generator, prompt[common:])
            stream = tokenizer.create_stream()
            while not generator.is_done() and len(reply) < max_new:
                generator.generate_next_token()
                token = int(generator.get_next_tokens()[0])
                if token in tokenizer.eos_token_ids:
                    break
                reply.append(token)
                out.write(stream.decode(token))
                out.flush()
        except KeyboardInterrupt:  # Ctrl-C during a reply stops the reply, not the chat
            out.write(" [stopped]")
        out.write("\n")
        out.flush()
        if args.verbose and reply:
            rate = len(reply) / (time.perf_counter() - started)
            print(f"[{len(reply)} tokens, {rate:.1f} tok/s]", file=sys.stderr)
        messages.append({"role": "assistant", "content": tokenizer.decode(reply)})


def _prefill(generator, ids) -> None:
    """Append ``ids``; a long prompt goes in steps with a progress line when stderr is a
    terminal (a long prefill is otherwise minutes of silence)."""
    if len(ids) < PREFILL_PROGRESS_TOKENS or not sys.stderr.isatty():
        generator.append_tokens(ids)
        return
    total = len(ids)
    try:
        for start in range(0, total, PREFILL_CHUNK):
            generator.append_tokens(ids[start : start + PREFILL_CHUNK])
            done = min(start + PREFILL_CHUNK, total)
            sys.stderr.write(f"\rgenai: prompt {done}/{total} tokens")
            sys.stderr.flush()
    finally:
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()


def _generate(args: argparse.Namespace) -> int:
    _check_lengths(args)
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    started = time.perf_counter()
    config, model, tokenizer = _load(args)
    if args.chat:
        messages = [{"role": "user", "content": prompt}]
        if args.system:
            messages.insert(0, {"role": "system", "content": args.system})
        prompt = tokenizer.apply_chat_template(json.dumps(messages), add_generation_prompt=True)
    ids = tokenizer.encode(prompt)
    if len(ids) == 0:
        raise InvalidArgumentError("the prompt encodes to no tokens")
    context = config.context_length
    if args.max_length is not None and args.max_length > context:
        raise InvalidArgumentError(
            f"--max-length {args.max_length} exceeds the model's context length ({context})"
        )
    if len(ids) >= context:
        raise InvalidArgumentError(
            f"the prompt ({len(ids)} tokens) does not fit the model's context length "
            f"({context} tokens) with room for a new token"
        )
    if args.max_length is not None:
        max_length = args.max_length
        if len(ids) >= max_length:
            raise InvalidArgumentError(
                f"the prompt ({len(ids)} tokens) is not shorter than --max-length {max_length}"
            )
    else:
        max_length = min(context, len(ids) + (args.max_new_tokens or DEFAULT_NEW_TOKENS))
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=max_length)
    generator = genai.Generator(model, params)
    _activate_adapters(model, generator, args.adapter)
    stream = tokenizer.create_stream()
    loaded = time.perf_counter()
    _prefill(generator, ids)
    prefilled = time.perf_counter()
    new_tokens = 0
    out = sys.stdout
    while not generator.is_done():
        generator.generate_next_token()
        new_tokens += 1
        out.write(stream.decode(int(generator.get_next_tokens()[0])))
        out.flush()
    finished = time.perf_counter()
    out.write("\n")
    if args.verbose:
        decode_s = finished - prefilled
        rate = new_tokens / decode_s if decode_s > 0 else float("inf")
        print(
            f"load {1000 * (loaded - started):.0f} ms, prompt {len(ids)} tokens, "
            f"prefill {1000 * (prefilled - loaded):.1f} ms, {new_tokens} new tokens, "
            f"decode {rate:.1f} tok/s",
            file=sys.stderr,
        )
    return 0


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at each record (tests swap it)."""

    @property
    def stream(self) -> object:  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass


def _leading_verbosity(argv: Sequence[str]) -> int:
    """The count of top-level ``-v`` / ``--verbose`` flags: those before the command."""
    count = 0
    for arg in argv:
        if not arg.startswith("-"):
            break
        if arg == "--verbose":
            count += 1
        elif len(arg) > 1 and arg[1] != "-" and set(arg[1:]) == {"v"}:
            count += len(arg) - 1
    return count


@contextlib.contextmanager
def _logging_to_stderr(verbosity: int) -> Iterator[None]:
    """With ``verbosity`` 1 (2 or more), the ``genai`` logger's INFO (DEBUG) records go to
    stderr until the block ends; the logger's level and handlers are restored after."""
    if verbosity <= 0:
        yield
        return
    logger = logging.getLogger("genai")
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    saved = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if verbosity == 1 else logging.DEBUG)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``genai`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # Configured before the parser is built: building it loads the plugins, which log.
    with _logging_to_stderr(_leading_verbosity(argv)):
        parser = _build_parser(argv)
        args = parser.parse_args(argv)
        try:
            return int(args.handler(args))
        except KeyboardInterrupt:
            return 130
        except (GenaiError, OSError) as exc:
            # What genai reports about its input (GenaiError) or a file it could not read or
            # write: one line. Anything else is a bug and keeps its traceback.
            log.debug("%s failed", args.command, exc_info=True)
            print(f"genai: error: {exc}", file=sys.stderr)
            return 1


if __name__ == "__main__":
    sys.exit(main())
