"""``genai generate``: generate text from a prompt, streaming it to stdout."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TextIO

import genai
from genai.cli.common import (
    DEFAULT_NEW_TOKENS,
    TextOut,
    UsageError,
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

__all__: list[str] = []


@command("generate", "generate text from a prompt, streaming it to stdout")
def _fill_generate(gen: argparse.ArgumentParser) -> None:
    gen.description = (
        "Generate text from a prompt, streaming it as it is produced (greedy unless the "
        "model folder or the sampling options below sample)."
    )
    gen.add_argument("prompt", help="the prompt text ('-' reads it from stdin)")
    add_model_option(gen)
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    gen.add_argument("--system", metavar="TEXT", help="system message (with --chat)")
    add_length_options(gen, None)
    gen.add_argument("--threads", type=int, metavar="N", help="ORT intra-op threads")
    add_adapter_option(gen)
    add_image_option(gen)
    add_search_options(gen)
    gen.add_argument(
        "-v", "--verbose", action="store_true", help="print prefill ms and decode tok/s to stderr"
    )
    gen.set_defaults(handler=_generate)


def _generate(args: argparse.Namespace) -> int:
    check_lengths(args)
    if args.system is not None and not args.chat:
        raise UsageError("--system needs --chat (the prompt is otherwise the model's raw input)")
    sampling = search_options(args)
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    started = time.perf_counter()
    config, model, tokenizer = load_model(args)
    images = load_images(args.image)
    processor = image_processor(model) if images is not None else None
    if processor is not None:
        prompt = with_image_tags(processor, prompt, len(images))
    if args.chat:
        messages = [{"role": "user", "content": prompt}]
        if args.system:
            messages.insert(0, {"role": "system", "content": args.system})
        prompt = tokenizer.apply_chat_template(json.dumps(messages), add_generation_prompt=True)
    inputs = processor(prompt, images=images) if processor is not None else None
    ids = inputs["input_ids"].as_numpy()[0] if inputs is not None else tokenizer.encode(prompt)
    if len(ids) == 0:
        raise InvalidArgumentError("the prompt encodes to no tokens")
    limit, what = sequence_limit(config, args.max_length)
    if len(ids) >= limit:
        raise InvalidArgumentError(
            f"the prompt ({len(ids)} tokens) does not fit {what} ({limit} tokens) with room "
            "for a new token"
        )
    asked = args.max_new_tokens or DEFAULT_NEW_TOKENS
    max_length = limit if args.max_length is not None else min(limit, len(ids) + asked)
    params = genai.GeneratorParams(model)
    params.set_search_options(**sampling, max_length=max_length)
    generator = genai.Generator(model, params)
    activate_adapters(model, generator, args.adapter)
    text = TextOut(tokenizer, generator.search.stop, sys.stdout)
    loaded = time.perf_counter()
    if inputs is not None:
        generator.set_inputs(inputs)  # the vision graph runs with the prompt
    else:
        prefill(generator, ids)
    prefilled = time.perf_counter()
    new_tokens = 0
    out = sys.stdout
    if generator.num_beams > 1:  # the best hypotheses are known only at the end
        new_tokens = _print_beams(generator, tokenizer, len(ids), out)
    else:
        while not generator.is_done():
            generator.generate_next_token()
            new_tokens += 1
            text.write(int(generator.get_next_tokens()[0]))
        text.end()
        out.write("\n")
        cut = generator.finish_reason(0) == genai.FinishReason.MAX_SESSION_TOKENS
        if cut and args.max_length is None and new_tokens < asked:
            print(f"genai: the output stopped at {what} ({limit} tokens): {new_tokens} new "
                  f"tokens of the {asked} asked", file=sys.stderr)  # fmt: skip
    finished = time.perf_counter()
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


def _print_beams(
    generator: genai.Generator, tokenizer: genai.Tokenizer, prompt: int, out: TextIO
) -> int:
    """Beam search to the end, then each returned hypothesis (best first) without its
    ``prompt`` tokens, one per paragraph; returns the steps run."""
    steps = 0
    while not generator.is_done():
        generator.generate_next_token()
        steps += 1
    returned = generator.search.num_return_sequences
    for index in range(returned):
        if returned > 1:
            out.write(f"--- hypothesis {index + 1} of {returned}\n")
        out.write(tokenizer.decode(generator.get_sequence(index)[prompt:]) + "\n")
    out.flush()
    return steps
