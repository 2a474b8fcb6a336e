"""OpenAI request bodies (validated with pydantic) and error bodies.

Every field is checked here, at the edge, before a request reaches the tokenizer or the
scheduler: types strictly (``"10"`` is not a number, ``"yes"`` not a boolean), numbers finite and
in range (sampling options with the sampler's own checks, `genai._core.sampling.check_options`),
the shapes of ``response_format``, ``tools``, ``tool_choice`` and messages, and the regular
expressions of JSON schemas (one whose expansion is too large for the grammar engine is refused
here rather than failing at the first token). A field that fails raises `APIError` (400) naming
it in ``param``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from genai._core.sampling import check_options

__all__ = [
    "MAX_CHOICES",
    "MAX_N",
    "MAX_PATTERN_SIZE",
    "APIError",
    "ChatCompletionRequest",
    "CompletionRequest",
    "error_body",
    "parse_request",
]

#: Most choices (``n``) one request may ask for.
MAX_N = 16
#: Most sequences (prompts x ``n``) one completion request may ask for.
MAX_CHOICES = 64
#: Most stop sequences (OpenAI's limit).
MAX_STOPS = 4
#: Largest token id a request may name (int32).
MAX_TOKEN_ID = 2**31 - 1
#: Largest expansion (characters a regular expression spells out once its counted repetitions
#: are unrolled, e.g. 10**6 for ``(a{1000}){1000}``) accepted in a JSON schema ``pattern``:
#: llguidance's lexer gives up ("too many expressions constructed") at about 10**6, after
#: seconds of work at the first token, while 10**5 still builds in well under a second.
MAX_PATTERN_SIZE = 100_000


class APIError(Exception):
    """An error answered with an OpenAI-style body and ``status`` (``headers``: extra
    response headers, e.g. ``Retry-After``)."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type or _TYPES.get(status, "invalid_request_error")
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        """``{"error": {...}}``."""
        return error_body(self.message, self.type, self.param, self.code)


_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


def error_body(
    message: str, type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The OpenAI error body."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def parse_request(raw: bytes, model: type[_Common]) -> Any:
    """Validate the JSON body ``raw`` as ``model`` (`ChatCompletionRequest` or
    `CompletionRequest`); raises `APIError` (400) naming the first bad field."""
    try:
        return model.model_validate_json(raw, strict=True)
    except ValidationError as exc:
        message, param = validation_message(exc)
        raise APIError(message, param=param) from None


def validation_message(exc: Any) -> tuple[str, str | None]:
    """``(message, param)`` of a pydantic (or FastAPI) validation error's first error."""
    errors = exc.errors()
    if not errors:
        return str(exc), None
    first = errors[0]
    if first.get("type") == "json_invalid":
        detail = str(first.get("ctx", {}).get("error") or first.get("msg", ""))
        return f"the request body is not valid JSON: {detail}", None
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    message = str(first.get("msg", "invalid request"))
    message = message.removeprefix("Value error, ")
    if first.get("type") == "missing" and param:
        message = "this field is required"
    return (f"{param}: {message}" if param else message), param


# --- regular expressions in JSON schemas ----------------------------------------------------------
try:  # Python >= 3.11
    import re._constants as _sre_constants
    import re._parser as _sre_parse
except ImportError:  # pragma: no cover - older Pythons
    import sre_constants as _sre_constants  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]

_REPEATS = {
    _sre_constants.MAX_REPEAT,
    _sre_constants.MIN_REPEAT,
    getattr(_sre_constants, "POSSESSIVE_REPEAT", _sre_constants.MAX_REPEAT),
}
_PROPERTY_CLASS = re.compile(r"\\[pP]\{[^}]*\}")
_COUNTS = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


def pattern_size(pattern: str) -> int:
    """How many characters ``pattern`` spells out once its counted repetitions are unrolled
    (``(a{1000}){1000}``: 10**6; an unbounded ``*`` or ``+`` counts its body once)."""
    try:
        tree = _sre_parse.parse(_PROPERTY_CLASS.sub(".", pattern))
    except (re.error, OverflowError, RecursionError, ValueError) as exc:
        if "too large" in str(exc) or isinstance(exc, OverflowError):
            return MAX_PATTERN_SIZE + 1
        # another dialect (ECMAScript): multiply every count found, an upper bound
        size = 1
        for low, high in _COUNTS.findall(pattern):
            size *= max(int(high or low), 1)
            if size > MAX_PATTERN_SIZE:
                break
        return size
    return _tree_size(tree)


def _tree_size(items: Any) -> int:
    total = 0
    for op, arg in items:
        if op in _REPEATS:
            low, high, sub = arg
            count = high if high != _sre_constants.MAXREPEAT else max(low, 1)
            total += max(int(count), 1) * _tree_size(sub)
        elif op is _sre_constants.SUBPATTERN:
            total += _tree_size(arg[-1])
        elif op is _sre_constants.BRANCH:
            total += sum(_tree_size(branch) for branch in arg[1])
        elif op in (_sre_constants.ASSERT, _sre_constants.ASSERT_NOT):
            total += _tree_size(arg[1])
        elif op is _sre_constants.GROUPREF_EXISTS:
            total += sum(_tree_size(branch) for branch in arg[1:] if branch is not None)
        else:
            total += 1
        if total > MAX_PATTERN_SIZE:
            return total
    return total


def check_schema_patterns(schema: Any) -> None:
    """Raise ValueError when a ``pattern`` (or ``patternProperties`` key) of the JSON schema
    ``schema`` is too large for the grammar engine (`MAX_PATTERN_SIZE`)."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            patterns = []
            if isinstance(node.get("pattern"), str):
                patterns.append(node["pattern"])
            if isinstance(node.get("patternProperties"), dict):
                patterns.extend(node["patternProperties"])
            for pattern in patterns:
                size = pattern_size(pattern)
                if size > MAX_PATTERN_SIZE:
                    raise ValueError(
                        f"the pattern {pattern[:60]!r} is too complex for constrained decoding "
                        f"(it unrolls to more than {MAX_PATTERN_SIZE} characters)"
                    )
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


# --- the request models ---------------------------------------------------------------------------
_SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
)


class StreamOptions(BaseModel):
    """``stream_options``."""

    model_config = ConfigDict(extra="ignore", strict=True)

    include_usage: bool = False


class _Common(BaseModel):
    """Fields shared by both endpoints."""

    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)

    model: str = ""
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    seed: int | None = Field(None, ge=-(2**63), lt=2**64)
    user: str | None = None
    # beyond OpenAI (as vLLM names them)
    top_k: int = Field(0, ge=0)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    # logits are divided or multiplied by it: beyond this range float32 logits overflow
    repetition_penalty: float = Field(1.0, ge=1e-6, le=1e6)
    ignore_eos: bool = False
    # genai's own: false opts this request out of `genai serve --speculative` (its tokens are
    # the same either way on exact graphs; vLLM and OpenAI have no per-request switch)
    speculative: bool = True

    @field_validator(*_SAMPLING_FIELDS)
    @classmethod
    def _check_sampling(cls, value: Any, info: Any) -> Any:
        # the sampler's own checks (what the scheduler would refuse at the first token)
        if value is not None:
            check_options({info.field_name: value})
        return value

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        if value is None:
            return value
        stops = [value] if isinstance(value, str) else value
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop sequences")
        if any(not s for s in stops):
            raise ValueError("stop sequences must not be empty")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _check_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is None:
            return value
        for key, bias in value.items():
            try:
                token = int(key)
            except ValueError:
                raise ValueError(f"logit_bias keys must be token ids, got {key!r}") from None
            if not 0 <= token <= MAX_TOKEN_ID:
                raise ValueError(f"logit_bias token id {key} is out of range")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"logit_bias values must be in [-100, 100], got {bias}")
        return value

    @model_validator(mode="after")
    def _check_stream_options(self) -> _Common:
        if self.stream_options is not None and not self.stream:
            raise APIError(
                "stream_options is only allowed with stream: true", param="stream_options"
            )
        return self

    @property
    def stops(self) -> list[str]:
        """Stop strings as a list."""
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        """``stream_options.include_usage``."""
        return bool(self.stream_options and self.stream_options.include_usage)


def _content_text(value: Any) -> str | None:
    """A message's content as text: a string, null, or a list of text parts (image_url
    parts are checked here and left out: `genai.serve.images` renders them)."""
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise ValueError("content must be a string, null or a list of text parts")
    parts = []
    for part in value:
        if isinstance(part, dict) and part.get("type") == "image_url":
            image_url = part.get("image_url")
            url = image_url.get("url") if isinstance(image_url, dict) else image_url
            if not isinstance(url, str):
                raise ValueError("an image_url content part needs a string image_url.url")
            continue
        if not isinstance(part, dict) or part.get("type") != "text":
            raise ValueError(
                "only text and image_url content parts ({'type': 'text', 'text': ...}, "
                "{'type': 'image_url', 'image_url': {'url': ...}}) are supported"
            )
        if not isinstance(part.get("text"), str):
            raise ValueError("a text content part needs a string 'text'")
        parts.append(part["text"])
    return "".join(parts)


class ChatMessage(BaseModel):
    """One chat message."""

    model_config = ConfigDict(extra="allow", strict=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Any = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    @field_validator("content")
    @classmethod
    def _check_content(cls, value: Any) -> Any:
        _content_text(value)
        return value

    @field_validator("tool_calls")
    @classmethod
    def _check_tool_calls(cls, value: list[dict[str, Any]] | None) -> Any:
        for call in value or ():
            function = call.get("function")
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise ValueError("each tool call needs a 'function' object with a string 'name'")
        return value

    @model_validator(mode="after")
    def _check_role(self) -> ChatMessage:
        if self.role == "assistant":
            if self.content is None and not self.tool_calls:
                raise ValueError("an assistant message needs content or tool_calls")
        elif self.content is None:
            raise ValueError(f"a {self.role} message needs content")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id it answers")
        return self

    def for_template(self, content: str | None = None) -> dict[str, Any]:
        """The message as the chat template takes it (content parts joined, or ``content``:
        the text with image tags `genai.serve.images` renders)."""
        out: dict[str, Any] = {
            "role": "system" if self.role == "developer" else self.role,
            "content": content if content is not None else _content_text(self.content) or "",
        }
        if self.name:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        return out


_FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


def _check_tool(tool: Any) -> None:
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        raise ValueError("each tool must be {'type': 'function', 'function': {...}}")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise ValueError("each tool needs a 'function' object")
    name = function.get("name")
    if not isinstance(name, str) or not _FUNCTION_NAME.match(name):
        raise ValueError(
            "a function name must be 1-64 letters, digits, '_', '.' or '-', got " + repr(name)
        )
    if function.get("description") is not None and not isinstance(function["description"], str):
        raise ValueError(f"the description of {name!r} must be a string")
    parameters = function.get("parameters")
    if parameters is not None:
        if not isinstance(parameters, dict):
            raise ValueError(f"the parameters of {name!r} must be a JSON schema object")
        check_schema_patterns(parameters)


class ChatCompletionRequest(_Common):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None

    @field_validator("response_format")
    @classmethod
    def _check_response_format(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return value
        kind = value.get("type")
        if kind not in ("text", "json_object", "json_schema"):
            raise ValueError(
                f"unsupported response_format type {kind!r} (text, json_object or json_schema)"
            )
        if kind == "json_schema":
            spec = value.get("json_schema")
            if not isinstance(spec, dict):
                raise ValueError("response_format.json_schema must be an object with a 'schema'")
            schema = spec.get("schema")
            if schema is None:
                raise ValueError("response_format.json_schema.schema is missing")
            if not isinstance(schema, dict | bool):
                raise ValueError("response_format.json_schema.schema must be a JSON schema object")
            if spec.get("name") is not None and not isinstance(spec["name"], str):
                raise ValueError("response_format.json_schema.name must be a string")
            check_schema_patterns(schema)
        return value

    @field_validator("tools")
    @classmethod
    def _check_tools(cls, value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for tool in value or ():
            _check_tool(tool)
        return value

    @field_validator("tool_choice")
    @classmethod
    def _check_tool_choice(cls, value: str | dict[str, Any] | None) -> Any:
        if value is None or value in ("none", "auto", "required"):
            return value
        if isinstance(value, str):
            raise ValueError(
                f"tool_choice must be 'none', 'auto', 'required' or a named function, got {value!r}"
            )
        function = value.get("function")
        if (
            value.get("type") != "function"
            or not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
        ):
            raise ValueError(
                "a named tool_choice is {'type': 'function', 'function': {'name': ...}}"
            )
        return value

    @model_validator(mode="after")
    def _check_combinations(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise APIError("top_logprobs needs logprobs: true", param="top_logprobs")
        if self.tool_choice is not None and not self.tools:
            raise APIError("tool_choice needs tools", param="tool_choice")
        if isinstance(self.tool_choice, dict):
            name = self.tool_choice["function"]["name"]
            names = {t["function"]["name"] for t in self.tools or ()}
            if name not in names:
                raise APIError(
                    f"tool_choice names the function {name!r}, which is not among the tools",
                    param="tool_choice",
                )
        if self.parallel_tool_calls is not None and not self.tools:
            raise APIError("parallel_tool_calls needs tools", param="parallel_tool_calls")
        return self

    @property
    def new_tokens_limit(self) -> int | None:
        """``max_completion_tokens`` or ``max_tokens``."""
        return self.max_completion_tokens or self.max_tokens

    @property
    def new_tokens_param(self) -> tuple[str, bool]:
        """The field `new_tokens_limit` comes from, and whether the client gave it."""
        if self.max_completion_tokens:
            return "max_completion_tokens", True
        return "max_tokens", True

    @property
    def n_logprobs(self) -> int | None:
        """None (off) or the number of alternatives."""
        if not self.logprobs:
            return None
        return self.top_logprobs or 0


class CompletionRequest(_Common):
    """``POST /v1/completions``."""

    prompt: Any
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=5)

    @model_validator(mode="before")
    @classmethod
    def _null_is_the_default(cls, data: Any) -> Any:
        """An explicit null ``max_tokens`` is the default, 16, as OpenAI (was the rest of the
        context); it counts as not given (`new_tokens_param`)."""
        if isinstance(data, dict) and "max_tokens" in data and data["max_tokens"] is None:
            data = {key: value for key, value in data.items() if key != "max_tokens"}
        return data

    echo: bool = False
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _check_prompt(cls, value: Any) -> Any:
        if isinstance(value, str):
            return value
        shape = (
            "prompt must be a string, a list of strings, a list of token ids or a list of lists "
            "of token ids"
        )
        if not isinstance(value, list):
            raise ValueError(shape)
        if not value:
            raise ValueError("prompt must not be empty")
        if all(isinstance(p, str) for p in value):
            return value
        rows = value if all(isinstance(p, list) for p in value) else [value]
        for row in rows:
            for token in row:
                if type(token) is not int:
                    raise ValueError(shape)
                if not 0 <= token <= MAX_TOKEN_ID:
                    raise ValueError(f"prompt token id {token} is out of range")
        return value

    @property
    def new_tokens_limit(self) -> int | None:
        """``max_tokens``."""
        return self.max_tokens

    @property
    def new_tokens_param(self) -> tuple[str, bool]:
        """The field `new_tokens_limit` comes from, and whether the client gave it (else the
        default of 16, as OpenAI's)."""
        return "max_tokens", "max_tokens" in self.model_fields_set

    @property
    def n_logprobs(self) -> int | None:
        """None (off) or the number of alternatives."""
        return self.logprobs

    def prompts(self) -> list[str | list[int]]:
        """Each prompt: text or token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if all(isinstance(p, int) for p in prompt):
            return [list(prompt)]
        return list(prompt)
