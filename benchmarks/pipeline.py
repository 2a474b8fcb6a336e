"""Pipeline (multi-graph) models: decode time per token, genai against the reference on the
same folder, written by `genai.testing.pipeline.write_pipeline_decoder` (embeddings, two
transformer stages of two layers each, LM head).

    python benchmarks/pipeline.py [--hidden 1024] [--vocab 32000] [--tokens 300] [--rounds 3]

Both engines run greedy decoding after a 57-token prompt, in alternating order, for each KV
layout (shared buffer; growing past/present); the script prints the best per-token time of
the rounds and genai's time over the reference's (below 1: genai is faster).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
from _bench_args import header, positive_int


def per_token(engine, folder: str, prompt: np.ndarray, tokens: int) -> float:
    """Seconds per generated token over ``tokens`` greedy steps after ``prompt``."""
    model = engine.Model(folder)
    params = engine.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + tokens + 8)
    generator = engine.Generator(model, params)
    generator.append_tokens(prompt)
    started = time.perf_counter()
    made = 0
    while made < tokens and not generator.is_done():
        generator.generate_next_token()
        made += 1
    return (time.perf_counter() - started) / max(made, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=positive_int, default=1024, help="a multiple of 128")
    parser.add_argument("--vocab", type=positive_int, default=32000, help="at least 63")
    parser.add_argument("--tokens", type=positive_int, default=300)
    parser.add_argument("--rounds", type=positive_int, default=3)
    args = parser.parse_args()
    if args.hidden % 128:
        parser.error("argument --hidden: a multiple of 128 (heads of 64, a KV head per 2)")
    if args.vocab < 63:
        parser.error("argument --vocab: at least 63 (the prompt's ids go up to 62)")
    header()

    import onnxruntime_genai as og

    import genai
    from genai.testing.pipeline import write_pipeline_decoder

    engines = {"genai": genai, "reference": og}
    prompt = (np.arange(57, dtype=np.int32) % 60) + 3
    print(f"hidden {args.hidden}, vocab {args.vocab}, 4 layers in 2 stages, {args.tokens} tokens")
    with tempfile.TemporaryDirectory() as tmp:
        for share in (True, False):
            folder = str(
                write_pipeline_decoder(
                    tmp,
                    num_layers=4,
                    layer_groups=[[0, 1], [2, 3]],
                    hidden_size=args.hidden,
                    num_heads=args.hidden // 64,
                    num_kv_heads=args.hidden // 128,
                    vocab_size=args.vocab,
                    context_length=len(prompt) + args.tokens + 64,
                    share_buffer=share,
                    name=f"pipeline-{share}",
                )
            )
            # the first ORT session a process creates decodes a few % slower (docs/benchmarks.md,
            # issue 2): a short throwaway run per engine first
            for engine in engines.values():
                per_token(engine, folder, prompt, 8)
            best = dict.fromkeys(engines, float("inf"))
            for round_ in range(args.rounds):
                order = list(engines) if round_ % 2 == 0 else list(reversed(engines))
                for name in order:
                    seconds = per_token(engines[name], folder, prompt, args.tokens)
                    best[name] = min(best[name], seconds)
            layout = "shared buffer" if share else "growing"
            ratio = best["genai"] / best["reference"]
            print(
                f"{layout:>13}: genai {best['genai'] * 1e3:.3f} ms/token, reference "
                f"{best['reference'] * 1e3:.3f} ms/token, genai / reference {ratio:.3f}x"
            )


if __name__ == "__main__":
    main()
