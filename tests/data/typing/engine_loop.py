"""docs/engine.md's loop as a user types it: `mypy --strict` must pass it
(tests/test_typing.py). Checked only, never run. A call followed by
``# type: ignore[arg-type]`` must be refused (mypy --strict reports an ignore that is not
needed)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

import genai as og

model = og.Model(og.default_model())
tokenizer = og.Tokenizer(model)
engine = og.Engine(model)

request_options = og.RequestOptions()
request_options.set_max_session_tokens(np.int64(512))
requests = [engine.create_request(), engine.create_request(options=request_options)]
prompts: list[npt.NDArray[np.int32] | list[int]] = [
    tokenizer.encode("What is the capital of France?"),  # an int32 array
    [1, 2, 3],  # or any int sequence
]
for request, tokens in zip(requests, prompts, strict=True):
    options = og.TurnOptions(request)
    options.set_max_generated_tokens(np.int64(24))
    options.set_min_generated_tokens(1)
    options.set_temperature(np.float32(0.7))
    options.set_top_k(40)
    options.set_top_p(0.9)
    options.set_do_sample(True)
    options.set_seed(1)
    options.set_stop_strings(["\n\n"])
    options.set_guidance("regex", r"[a-z ]+")
    options.set_top_k("40")  # type: ignore[arg-type]
    turn: int = request.begin_turn(tokens, options)
requests[0].begin_turn((1, 2, 3))

replies: dict[int, list[int]] = {id(r): [] for r in requests}
buffer = engine.create_event_buffer(16)
while engine.has_pending_requests():
    engine.run(buffer)
    for event in buffer:  # the buffer iterates its events
        if event.token is not None:
            replies[id(event.request)].append(event.token)
        if event.flags & og.EngineEventFlags.TURN_FINISHED:
            print(event.turn_id, event.finish_reason, event.usage.generated_tokens)
    first: og.EngineEvent = buffer[0]
for request in requests:
    print(tokenizer.decode(replies[id(request)]))
    request.close()
