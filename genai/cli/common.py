"""What several ``genai`` commands share: the model option's loading (``-m`` or the default
model), length, sampling and adapter options, and the prefill with a progress line."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import genai
from genai import hub
from genai.boolean_words import parse_bool_word
from genai.constraints.stop import StopStringMatcher
from genai.errors import GenaiError, InvalidArgumentError, SearchOptionError
from genai.generation.search import SearchOptions

__all__ = [
    "DEFAULT_NEW_TOKENS",
    "PREFILL_CHUNK",
    "PREFILL_PROGRESS_TOKENS",
    "UsageError",
    "activate_adapters",
    "add_adapter_option",
    "add_length_options",
    "add_model_option",
    "add_search_options",
    "check_lengths",
    "check_threads",
    "default_model",
    "key_values",
    "load_model",
    "prefill",
    "provider_choice",
    "resolve_model_arg",
    "search_options",
]

DEFAULT_NEW_TOKENS = 256


class UsageError(InvalidArgumentError):
    """Command-line options the command refuses (a value out of range, options that do not go
    together): reported as argparse reports its own errors, after the command's usage line,
    with exit status 2."""


#: Prompts at least this long show a prefill progress line (when stderr is a terminal).
PREFILL_PROGRESS_TOKENS = 1024


#: Tokens per prefill step while a progress line is shown.
PREFILL_CHUNK = 512


def add_model_option(parser: argparse.ArgumentParser) -> None:
    """``-m/--model``: a model folder or a Hugging Face repo (default: the default model);
    ``--provider`` and ``--provider-option``: the execution provider to run it on."""
    parser.add_argument(
        "-m",
        "--model",
        metavar="DIR|REPO_ID[:SUBFOLDER]",
        help="model folder, or a Hugging Face model repo (from the hub cache, downloaded "
        "unless HF_HUB_OFFLINE=1; see genai pull) (default: the default model, "
        "SmolLM2-135M-Instruct int4, pulled on first use)",
    )
    parser.add_argument(
        "--provider",
        metavar="NAME",
        help="execution provider to run the model on, instead of the ones its "
        "genai_config.json lists (`genai providers` shows the installed ones)",
    )
    parser.add_argument(
        "--provider-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of --provider (repeatable)",
    )


def key_values(
    items: Sequence[str], flag: str, error: type[GenaiError] = UsageError
) -> dict[str, str]:
    """The ``KEY=VALUE`` arguments of ``flag`` as a dict; ``error`` for one that has no "="
    or no key."""
    options: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise error(f"{flag} expects KEY=VALUE, got {item!r}")
        options[key] = value
    return options


def provider_choice(args: argparse.Namespace) -> tuple[str, dict[str, str]] | None:
    """``--provider`` and its ``--provider-option`` values, or None when no provider was
    chosen (`UsageError` for an option without a provider or not ``KEY=VALUE``)."""
    options = key_values(getattr(args, "provider_option", None) or (), "--provider-option")
    provider = getattr(args, "provider", None)
    if provider is None:
        if options:
            raise UsageError("--provider-option needs --provider")
        return None
    if not provider.strip():
        raise UsageError("--provider needs a provider name")
    return provider, options


def add_length_options(parser: argparse.ArgumentParser, default_new: int | None) -> None:
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


def check_lengths(args: argparse.Namespace) -> None:
    for flag in ("max_length", "max_new_tokens"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")


def sequence_limit(config: genai.Config, max_length: int | None) -> tuple[int, str]:
    """The longest sequence a command may make and how messages name it: ``--max-length``
    when given (InvalidArgumentError above the model's context length, as the Python API's
    ``max_length``), else the model's default: its ``search.max_length`` when set below the
    context length (where a generator stops by default), else ``model.context_length``."""
    context = config.context_length
    if max_length is not None:
        if max_length > context:
            raise InvalidArgumentError(
                f"--max-length {max_length} exceeds the model's context length ({context})"
            )
        return max_length, "--max-length"
    limit = config.max_length
    if limit < context:
        return limit, "the model's search.max_length (--max-length raises it)"
    return limit, "the model's context length"


class TextOut:
    """A reply's tokens, decoded, to ``out`` as they come, without the stop strings of the
    search option ``stop`` (text that may still begin one is held back; the one that ends the
    reply is never written), as genai serve streams them."""

    def __init__(self, tokenizer: genai.Tokenizer, stops: Sequence[str], out: TextIO) -> None:
        self._stream = tokenizer.create_stream()
        self._stops = StopStringMatcher(stops) if stops else None
        self._out = out

    def write(self, token: int) -> None:
        """Decode ``token`` and write what is safe to show now."""
        text = self._stream.decode(token)
        if self._stops is not None:
            text, _ = self._stops.push(text)
        self._out.write(text)
        self._out.flush()

    def end(self) -> None:
        """Write the text held back (at the end of the reply)."""
        if self._stops is not None:
            self._out.write(self._stops.flush())
            self._out.flush()


def check_threads(args: argparse.Namespace) -> None:
    """``--threads``, when given, is at least 1 (`UsageError`)."""
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads must be >= 1, got {args.threads}")


def add_search_options(parser: argparse.ArgumentParser) -> None:
    """Sampling flags and ``--search KEY=VALUE`` for any other search option."""
    group = parser.add_argument_group(
        "sampling",
        "By default the model folder's search options apply (greedy unless its "
        "genai_config.json samples); --temperature, --top-k and --top-p turn sampling on.",
    )
    group.add_argument(
        "--do-sample", action="store_true", default=None, help="sample instead of greedy"
    )
    group.add_argument("--temperature", type=float, metavar="T", help="sampling temperature")
    group.add_argument("--top-k", type=int, metavar="K", help="sample among the K likeliest")
    group.add_argument(
        "--top-p", type=float, metavar="P", help="sample within probability mass P (0 < P < 1)"
    )
    group.add_argument(
        "--seed", type=int, metavar="N", help="random seed: the same seed, the same text"
    )
    group.add_argument(
        "--repetition-penalty", type=float, metavar="R", help="penalise repeated tokens (> 1)"
    )
    group.add_argument(
        "--search",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any search option by name, repeatable (e.g. min_p=0.05, chunk_size=256, "
        "no_repeat_ngram_size=3)",
    )


def _search_value(name: str, text: str) -> object:
    """``text`` as the type of search option ``name`` (unknown names are left to
    `genai.GeneratorParams.set_search_options`, which names the known ones)."""
    kinds = {f.name: str(f.type) for f in dataclasses.fields(SearchOptions)}
    kind = kinds.get(name, "")
    if name == "stop":
        return [text]
    try:
        if kind == "bool":
            word = parse_bool_word(text)
            if word is None:
                raise ValueError(text)
            return word
        if kind == "int":
            return int(text)
        return float(text)
    except ValueError:
        what = {"bool": "true or false", "int": "an integer"}.get(kind, "a number")
        raise UsageError(f"--search {name}={text}: expected {what}") from None


#: Search options the commands set themselves: what to use instead of ``--search``.
_SET_BY_THE_COMMAND = {
    "max_length": "use --max-length",
    "max_new_tokens": "use --max-new-tokens",
    "batch_size": "the command runs one prompt (batch size 1)",
}


def search_options(args: argparse.Namespace) -> dict[str, object]:
    """The search options the sampling flags and ``--search`` ask for."""
    options: dict[str, object] = {}
    for spec in args.search:
        name, sep, text = spec.partition("=")
        name = name.strip()
        if not sep or not name:
            raise UsageError(f"--search {spec!r}: expected KEY=VALUE")
        if name in _SET_BY_THE_COMMAND:
            raise UsageError(f"--search {name}: {_SET_BY_THE_COMMAND[name]}")
        options[name] = _search_value(name, text.strip())
    flags = {
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "repetition_penalty": args.repetition_penalty,
        "random_seed": args.seed,
    }
    options.update({name: value for name, value in flags.items() if value is not None})
    sampling = (args.temperature, args.top_k, args.top_p)
    if args.do_sample or any(value is not None for value in sampling):
        options["do_sample"] = True
    try:  # names, types and ranges, before any model loads (the context length: later)
        probe = SearchOptions()
        probe.update(**options)
        probe.validate(context_length=2**31 - 1)
    except SearchOptionError as exc:
        raise UsageError(str(exc)) from None
    return options


def default_model() -> Path:
    """The default model folder, pulled and built on first use (progress on stderr)."""
    from genai.builder.pull import ensure_default_model  # lazy: the builder imports onnx

    return ensure_default_model(progress=True)


def resolve_model_arg(args: argparse.Namespace) -> str | None:
    """Replace ``args.model`` (``-m``; the default model when absent) by its folder; returns
    the name ``-m`` gave when it named a cached model (what `genai serve` answers to), else
    None."""
    if args.model is None:
        args.model = str(default_model())
    given = args.model
    args.model = hub.resolve_model(args.model)  # REPO_ID[:SUBFOLDER]: from the hub cache
    return given if args.model != given else None


def load_model(args: argparse.Namespace, speech: bool = False):
    """Config, model and tokenizer for ``-m`` (or the default model) and ``--threads``; a
    Whisper model is refused, pointing at ``genai transcribe``, unless ``speech``."""
    check_threads(args)
    choice = provider_choice(args)
    args.model_label = resolve_model_arg(args)
    path = Path(args.model)
    if path.is_file() and path.suffix.lower() == ".gguf":
        raise InvalidArgumentError(
            f"-m {args.model} is a GGUF file, not a model folder: build it first with "
            f"`genai build {args.model} -o DIR`, then use -m DIR"
        )
    config = genai.Config(args.model)
    if args.threads is not None:
        config.overlay({"model": {"decoder": {"session_options": {
            "intra_op_num_threads": args.threads}}}})  # fmt: skip
    if choice is not None:
        config.select_provider(*choice)
    model = genai.Model(config)
    if model.type == "whisper" and not speech:
        raise InvalidArgumentError(
            f"-m {args.model} is a Whisper (speech) model: for audio, use "
            f"`genai transcribe FILE -m {args.model}`"
        )
    return config, model, genai.Tokenizer(model)


def add_adapter_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--adapter",
        action="append",
        default=[],
        metavar="FILE[=NAME]",
        help="activate a LoRA .onnx_adapter file (repeatable; several add up)",
    )


def activate_adapters(model, generator, specs: list[str]) -> None:
    """Load each ``FILE[=NAME]`` of ``--adapter`` and activate it on ``generator``."""
    if not specs:
        return
    adapters = genai.Adapters(model)
    for spec in specs:
        path, sep, name = spec.partition("=")
        name = name if sep else Path(path).stem
        adapters.load(path, name)
        generator.set_active_adapter(adapters, name)  # the generator keeps the bound weights


def prefill(generator, ids) -> None:
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
