"""``genai chat``: a multi-turn chat in the terminal, streaming each reply."""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

import genai
from genai.cli.common import (
    DEFAULT_NEW_TOKENS,
    TextOut,
    activate_adapters,
    add_adapter_option,
    add_length_options,
    add_model_option,
    add_search_options,
    check_lengths,
    load_model,
    prefill,
    search_options,
    sequence_limit,
)
from genai.cli.images import add_image_option, image_processor, load_images, with_image_tags
from genai.cli.registry import command
from genai.errors import InvalidArgumentError

__all__ = ["CHAT_COMMANDS"]

#: The chat's own commands (a line starting with "/"), as /help lists them.
CHAT_COMMANDS: tuple[tuple[str, str], ...] = (
    ("/help", "lists these commands"),
    ("/reset", "starts the conversation again (keeps the system message)"),
    ("/system TEXT", "sets the system message and starts again (/system alone: none)"),
    ("/exit", "ends the chat (as Ctrl-D does)"),
)


@command("chat", "chat with a model in the terminal (multi-turn, streaming)")
def _fill_chat(chat: argparse.ArgumentParser) -> None:
    chat.description = (
        "A multi-turn chat: each line you type is a user message; the reply streams as it is "
        "produced. The conversation's KV cache is reused between turns. Commands: "
        + "; ".join(f"{c} {h}" for c, h in CHAT_COMMANDS)
        + ". Ctrl-C stops a reply; Ctrl-D or /exit ends the chat."
    )
    add_model_option(chat)
    chat.add_argument("--system", metavar="TEXT", help="system message")
    add_length_options(chat, None)
    chat.add_argument("--threads", type=int, metavar="N", help="ORT intra-op threads")
    add_adapter_option(chat)
    add_image_option(chat)  # the first user message of each conversation carries the images
    add_search_options(chat)
    chat.add_argument("-v", "--verbose", action="store_true", help="print tok/s per reply")
    chat.set_defaults(handler=_chat)


def _chat_help() -> str:
    width = max(len(c) for c, _ in CHAT_COMMANDS)
    lines = [f"  {c:<{width}}  {h}" for c, h in CHAT_COMMANDS]
    lines.append("  Ctrl-C stops a reply; start a message with // to send one beginning with /")
    return "\n".join(lines)


def _read_line(interactive: bool, readline_ends_lines: bool = False) -> str | None:
    """The next line the user typed (without its newline), or None at the end of input.
    On a terminal, ``input`` edits the line with readline (arrows, history); at Ctrl-D the
    shell's prompt gets a line of its own (readline with bracketed paste ends it itself)."""
    if interactive:
        try:
            return input("> ")
        except EOFError:
            if not readline_ends_lines:
                sys.stdout.write("\n")
                sys.stdout.flush()
            return None
    line = sys.stdin.readline()
    return line.rstrip("\n") if line else None


def _enable_line_editing() -> bool:
    """Line editing and history for ``input`` where the standard library has readline, with
    bracketed paste: a pasted block of several lines is one message (CPython turns it off,
    and each pasted line was then sent as a message of its own). True when it is on."""
    try:
        import readline  # importing it is what turns editing on
    except ImportError:  # e.g. Windows without pyreadline
        return False
    version = getattr(readline, "_READLINE_LIBRARY_VERSION", "")
    gnu = "libedit" not in (readline.__doc__ or "") and version[:1].isdigit()
    if not gnu or tuple(int(p) for p in version.split(".")[:2]) < (8, 1):
        return False  # libedit (macOS) or an older GNU readline: no bracketed paste
    if os.environ.get("TERM", "") in ("", "dumb"):
        return False  # readline turns it off there
    readline.parse_and_bind("set enable-bracketed-paste on")
    return True


def _templated(tokenizer: genai.Tokenizer, messages: list[dict[str, str]]) -> np.ndarray:
    """The token ids of ``messages`` through the chat template, with the generation prompt."""
    return tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True))


def _system_length(tokenizer: genai.Tokenizer, system: str) -> int:
    """Tokens of the templated conversation holding the system message alone."""
    return len(_templated(tokenizer, [{"role": "system", "content": system}]))


def _too_long(
    tokenizer: genai.Tokenizer, system: str | None, content: str, length: int, limit: int,
    what: str,
) -> str:  # fmt: skip
    """Why a conversation of ``length`` tokens cannot take the message ``content``: the
    history (/reset helps), the message itself, or the system message (/system helps)."""
    fresh = [{"role": "user", "content": content}]
    if system:
        fresh.insert(0, {"role": "system", "content": system})
    alone = len(_templated(tokenizer, fresh))
    if alone + 1 <= limit:
        return (
            f"genai: the conversation ({length} tokens) no longer fits {what} ({limit} tokens); "
            "/reset starts again"
        )
    if system and _system_length(tokenizer, system) + 1 > limit:
        return (
            f"genai: the system message fills {what} ({limit} tokens) alone; /system TEXT sets "
            "a shorter one (/system alone: none)"
        )
    return (
        f"genai: your message ({alone} tokens with the chat template) does not fit {what} "
        f"({limit} tokens) even in a new conversation; shorten it"
    )


def _chat(args: argparse.Namespace) -> int:
    check_lengths(args)
    sampling = search_options(args)
    max_new = args.max_new_tokens or DEFAULT_NEW_TOKENS
    config, model, tokenizer = load_model(args)
    limit, what = sequence_limit(config, args.max_length)
    params = genai.GeneratorParams(model)
    params.set_search_options(**sampling, max_length=limit)
    generator = genai.Generator(model, params)
    if generator.num_beams > 1:
        raise InvalidArgumentError(
            f"genai chat streams one reply and continues the conversation on it: beam search "
            f"(num_beams {generator.num_beams}) needs `genai generate`"
        )
    activate_adapters(model, generator, args.adapter)
    images = load_images(args.image)
    processor = image_processor(model) if images is not None else None
    image_prompt_length = 0  # the prompt set_inputs took (its images included)
    system = args.system
    if system and processor is None:
        length = _system_length(tokenizer, system)
        if length + 1 > limit:
            raise InvalidArgumentError(
                f"--system: the system message ({length} tokens) does not fit {what} "
                f"({limit} tokens) with room for a reply"
            )
    messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    interactive = sys.stdin.isatty()
    bracketed_paste = interactive and _enable_line_editing()
    out = sys.stdout
    print("genai chat: /help lists commands; Ctrl-C stops a reply; /exit or Ctrl-D leaves.",
          file=sys.stderr)  # fmt: skip
    while True:
        try:
            line = _read_line(interactive, bracketed_paste)
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
        inputs = None
        if processor is not None:  # the images go with the conversation's first user message
            tagged = [dict(m) for m in messages]
            first = next(m for m in tagged if m["role"] == "user")
            first["content"] = with_image_tags(processor, first["content"], len(images))
            text = tokenizer.apply_chat_template(tagged, add_generation_prompt=True)
            inputs = processor(text, images=images)
            prompt = inputs["input_ids"].as_numpy()[0]
        else:
            prompt = _templated(tokenizer, messages)
        if len(prompt) + 1 > limit:
            messages.pop()
            print(_too_long(tokenizer, system, content, len(prompt), limit, what),
                  file=sys.stderr)  # fmt: skip
            continue
        # Reuse the KV cache: keep the common prefix with what the model has seen, feed the rest.
        seen = generator.get_sequence(0) if generator.token_count() else prompt[:0]
        common = 0
        shared = min(len(seen), len(prompt) - 1)
        while common < shared and seen[common] == prompt[common]:
            common += 1
        restart = inputs is not None and (
            generator.token_count() == 0 or common < image_prompt_length
        )
        if restart and generator.token_count():  # the images' tokens changed: start again
            generator = genai.Generator(model, params)
            activate_adapters(model, generator, args.adapter)
        elif common < generator.token_count():
            generator.rewind_to(common)
        reply: list[int] = []
        started = time.perf_counter()
        ended = False  # by an EOS token or a Ctrl-C, not by a length
        shown = TextOut(tokenizer, generator.search.stop, out)
        try:
            if restart:
                generator.set_inputs(inputs)  # the vision graph runs with the prompt
                image_prompt_length = len(prompt)
            else:
                prefill(generator, prompt[common:])
            while not generator.is_done() and len(reply) < max_new:
                generator.generate_next_token()
                token = int(generator.get_next_tokens()[0])
                if token in tokenizer.eos_token_ids:
                    ended = True
                    break
                reply.append(token)
                shown.write(token)
            shown.end()
        except KeyboardInterrupt:  # Ctrl-C during a reply stops the reply, not the chat
            shown.end()
            out.write(" [stopped]")
            ended = True
        out.write("\n")
        out.flush()
        if not ended and generator.finish_reason(0) == genai.FinishReason.MAX_SESSION_TOKENS:
            print(f"genai: the reply was cut: the conversation filled {what} ({limit} "
                  "tokens); /reset starts again", file=sys.stderr)  # fmt: skip
        if args.verbose and reply:
            rate = len(reply) / (time.perf_counter() - started)
            print(f"[{len(reply)} tokens, {rate:.1f} tok/s]", file=sys.stderr)
        messages.append({"role": "assistant", "content": tokenizer.decode(reply)})
