"""README.md's Python examples as written there: `mypy --strict` must pass them
(tests/test_typing.py). Checked only, never run."""

import genai as og

model = og.Model(og.default_model())  # SmolLM2-135M-Instruct, pulled and built on first use
tokenizer = og.Tokenizer(model)
stream = tokenizer.create_stream()

prompt = tokenizer.apply_chat_template(
    [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True
)
params = og.GeneratorParams(model)
params.set_search_options(max_length=96)
generator = og.Generator(model, params)
generator.append_tokens(tokenizer.encode(prompt))
while not generator.is_done():
    generator.generate_next_token()
    print(stream.decode(generator.get_next_tokens()[0]), end="", flush=True)
print()

# prefix reuse
system = [{"role": "system", "content": "You answer in one short sentence."}]
prefix = tokenizer.encode(tokenizer.apply_chat_template(system, add_generation_prompt=False))

params = og.GeneratorParams(model)
params.set_search_options(max_length=256)  # the KV cache grows as needed
base = og.Generator(model, params)
base.append_tokens(prefix)
snapshot = base.snapshot()  # the system prompt, computed once

for question in ("What is the capital of France?", "What is the capital of Spain?"):
    messages = [*system, {"role": "user", "content": question}]
    ids = tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    generator = og.Generator(model, params)
    generator.restore(snapshot)
    generator.append_tokens(ids[len(prefix) :])
    generator.generate_until_done(48)  # no GIL round trips between tokens
    print(tokenizer.decode(generator.get_sequence(0)[len(ids) :]))

folder: str = og.default_model()  # the folder's path
