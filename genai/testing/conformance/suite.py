"""The conformance test classes.

Each ``*Tests`` class covers one area; `ProviderConformanceTests` inherits them all. A vendor
subclasses the aggregate in a module pytest collects::

    from genai.testing.conformance import ProviderConformanceTests

    class TestMyProvider(ProviderConformanceTests):
        provider_name = "myep"                # or run with --genai-provider myep
        provider_options = {"device_id": "0"}

and may override the fixtures ``genai_provider_name``, ``genai_provider_options`` and
``genai_model_dir`` (a model folder of its own instead of the tiny models the suite writes).
Tests that need a capability the provider declares unsupported are skipped (`requires`).
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

import genai
from genai.errors import (
    ConfigError,
    GenerationError,
    MissingDependencyError,
    ProviderUnavailableError,
    SearchOptionError,
)
from genai.multimodal.images import pillow_image
from genai.providers import REQUIREMENTS, ExecutionProvider, SessionSpec, get_provider_class
from genai.runtime.config import normalize_provider_name
from genai.testing.models import write_gqa_decoder
from genai.testing.vision import write_phi3v, write_qwen2_5_vl
from genai.testing.whisper import synthetic_speech, write_whisper_fixture

__all__ = [
    "BatchTests",
    "BufferPlacementTests",
    "ConformanceFixtures",
    "ErrorTests",
    "GraphCaptureTests",
    "GreedyParityTests",
    "KVLayoutTests",
    "ProbeResult",
    "ProviderConformanceTests",
    "RewindContinuousTests",
    "SeededSamplingTests",
    "SessionCreationTests",
    "SpeechTests",
    "VisionTests",
    "probe",
    "requires",
]

#: New tokens each comparison generates.
NEW_TOKENS = 16
#: The tiny Whisper fixture's weight seed: its greedy tokens vary from step to step and
#: differ between the two synthetic clips (with other seeds they collapse onto one token).
SPEECH_SEED = 5
#: Whisper's prompt for an English transcript without timestamps.
SPEECH_PROMPT = "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"
#: One prompt per vision-language fixture, with its image tag.
VISION_PROMPTS = {
    "phi3v": "<|user|>\n<|image_1|>\nwhat is in the picture?<|end|>\n<|assistant|>\n",
    "qwen2_5_vl": "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>what is in the "
    "picture?<|im_end|>\n<|im_start|>assistant\n",
}

_MODELS: dict[tuple[str, str], Path] = {}


@dataclass(frozen=True)
class ProbeResult:
    """One call of a provider's availability probe (`ExecutionProvider.unavailable_reason`)."""

    #: What it returned (None: available; a str: why not).
    reason: Any = None
    #: What it raised instead (an interrupted call, e.g. by a test timeout, keeps its exception).
    error: BaseException | None = None
    #: How long the call took.
    seconds: float = 0.0
    #: ORT sessions (``onnxruntime.InferenceSession``) it created.
    sessions: int = 0
    #: The call did not return (a test timeout or Ctrl-C stopped it).
    interrupted: bool = False

    def failure(self) -> str | None:
        """Why the probe gave no answer (None when it returned)."""
        if self.interrupted:
            return (
                f"the availability probe did not return (stopped after {self.seconds:.1f} s: "
                f"{self.error})"
            )
        if self.error is not None:
            return (
                f"the availability probe raised {type(self.error).__name__}: {self.error} "
                "(it must return a reason instead)"
            )
        return None


def call_probe(cls: type[ExecutionProvider]) -> ProbeResult:
    """Call ``cls().unavailable_reason()`` once, timed, counting the ORT sessions it creates.

    An exception is kept in the result; an interruption (`BaseException`: a test timeout,
    Ctrl-C) propagates, its `ProbeResult` attached as ``exc.genai_probe``."""
    try:
        import onnxruntime as ort
    except ImportError:  # no ORT Python package: no InferenceSession to count
        ort = None
    sessions: list[tuple[Any, ...]] = []
    real = getattr(ort, "InferenceSession", None)

    def counting(*args: Any, **kwargs: Any) -> Any:
        sessions.append(args)
        return real(*args, **kwargs)

    if real is not None:
        ort.InferenceSession = counting
    start = time.perf_counter()
    try:
        reason = cls().unavailable_reason()
    except Exception as exc:
        return ProbeResult(None, exc, time.perf_counter() - start, len(sessions))
    except BaseException as exc:
        exc.genai_probe = ProbeResult(  # type: ignore[attr-defined]
            None, exc, time.perf_counter() - start, len(sessions), interrupted=True
        )
        raise
    finally:
        if real is not None:
            ort.InferenceSession = real
    return ProbeResult(reason, None, time.perf_counter() - start, len(sessions))


_PROBES = pytest.StashKey[dict[type, ProbeResult]]()


def probe(config: pytest.Config, cls: type[ExecutionProvider]) -> ProbeResult:
    """``cls``'s probe result in ``config``'s pytest session: the probe is called once per
    session (`call_probe`), then remembered, an interrupted call too (a hung probe stops one
    test, not every test)."""
    cache = config.stash.setdefault(_PROBES, {})
    if cls not in cache:
        try:
            cache[cls] = call_probe(cls)
        except BaseException as exc:
            cache[cls] = exc.genai_probe  # type: ignore[attr-defined]
            raise
    return cache[cls]


def probed(config: pytest.Config, cls: type[ExecutionProvider]) -> ProbeResult | None:
    """``cls``'s remembered probe result in ``config``'s session (None: not probed yet)."""
    return config.stash.get(_PROBES, {}).get(cls)


def _cached_model(
    tmp_path_factory: pytest.TempPathFactory, name: str, write: Callable[[Path], Path]
) -> Path:
    """The folder ``write(root)`` makes, written once per pytest session (basetemp)."""
    key = (str(tmp_path_factory.getbasetemp()), name)
    if key not in _MODELS or not (_MODELS[key] / "genai_config.json").is_file():
        _MODELS[key] = write(tmp_path_factory.mktemp("genai-conformance"))
    return _MODELS[key]


def synthetic_png(height: int = 48, width: int = 64) -> bytes:
    """A PNG file's bytes: colour stripes over a gradient (`MissingDependencyError` without
    Pillow)."""
    yy, xx = np.mgrid[0:height, 0:width]
    pixels = np.stack([(xx // 8 % 2) * 255, yy * 255 // height, np.full_like(xx, 90)], -1)
    buffer = io.BytesIO()
    pillow_image().fromarray(pixels.astype(np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def requires(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a test as needing provider capabilities (`genai.providers.base.REQUIREMENTS`); it is
    skipped for a provider that declares one unsupported."""
    unknown = set(names) - REQUIREMENTS
    if unknown:
        raise ValueError(f"unknown requirement(s) {sorted(unknown)}; known: {sorted(REQUIREMENTS)}")

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn.genai_requires = (*getattr(fn, "genai_requires", ()), *names)  # type: ignore[attr-defined]
        return fn

    return mark


def unsupported(provider: type[ExecutionProvider], requirement: str) -> str | None:
    """Why ``provider`` cannot take a test needing ``requirement`` (None when it can)."""
    caps = provider.capabilities
    ok = {
        "exact": caps.exact,
        "kv_shared": "shared" in caps.kv_layouts,
        "kv_growing": "growing" in caps.kv_layouts,
        "batch": caps.batch,
        "continuous_decoding": caps.continuous_decoding,
        "rewind": caps.rewind,
        "graph_capture": provider.graph_capture is not None,
        "seeded_sampling": caps.seeded_sampling,
        "speech": caps.speech,
        "vision": caps.vision,
    }[requirement]
    if not ok:
        return f"{provider.name} declares {requirement} unsupported"
    capture = provider.graph_capture
    needs_shared = capture is not None and capture.requires_shared_buffer
    if requirement == "graph_capture" and needs_shared and "shared" not in caps.kv_layouts:
        return (
            f"{provider.name}'s graph capture needs the shared-buffer KV layout, which it "
            "declares unsupported"
        )
    return None


# ---------------------------------------------------------------------------------------------
# Fixtures and helpers
# ---------------------------------------------------------------------------------------------


class ConformanceFixtures:
    """Fixtures every conformance class uses; override them (or the class attributes) in the
    vendor's subclass. Precedence: class attribute, then the pytest option
    (``--genai-provider``, ``--genai-provider-option``, ``--genai-model``), then the default."""

    #: Provider to test (None: the --genai-provider option, else "cpu").
    provider_name: ClassVar[str | None] = None
    #: Provider options (strings), merged over --genai-provider-option KEY=VALUE.
    provider_options: ClassVar[Mapping[str, str]] = {}
    #: A model folder of the vendor's (None: the suite writes tiny models).
    model_dir: ClassVar[str | None] = None
    #: The most seconds the availability probe may take (the faster of two calls, so that a
    #: first import of a large EP library does not count): it runs at every model load.
    probe_seconds: ClassVar[float] = 2.0

    @classmethod
    def provider_under_test(cls, config: pytest.Config) -> tuple[str, dict[str, str]]:
        """(normalised provider name, options) the class tests by its attributes and the pytest
        options: what the fixtures give unless a subclass overrides them."""
        name = cls.provider_name or config.getoption("genai_provider", None) or "cpu"
        options: dict[str, str] = {}
        for item in config.getoption("genai_provider_option", None) or ():
            key, _, value = str(item).partition("=")
            options[key] = value
        options.update(cls.provider_options)
        return normalize_provider_name(str(name)), options

    @pytest.fixture
    def genai_provider_name(self, request: pytest.FixtureRequest) -> str:
        return self.provider_under_test(request.config)[0]

    @pytest.fixture
    def genai_provider_options(self, request: pytest.FixtureRequest) -> dict[str, str]:
        return self.provider_under_test(request.config)[1]

    @pytest.fixture
    def genai_model_dir(
        self, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
    ) -> Path:
        explicit = self.model_dir or request.config.getoption("genai_model", None)
        if explicit:
            return Path(explicit)
        return _cached_model(
            tmp_path_factory, "gqa", lambda root: write_gqa_decoder(root, name="gqa", seed=11)
        )

    @pytest.fixture
    def genai_capture_model_dir(
        self, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
    ) -> Path:
        """The model graph capture runs on: the vendor's (--genai-model), else the suite's
        tiny model with the attention-mask arithmetic the reference's builder emits for graph
        capture (`write_gqa_decoder(static_mask=True)`: the total length from the mask's
        contents, so the mask is a static [1, max_length] buffer and no node is left to the
        CPU)."""
        explicit = self.model_dir or request.config.getoption("genai_model", None)
        if explicit:
            return Path(explicit)
        return _cached_model(
            tmp_path_factory,
            "gqa-static",
            lambda root: write_gqa_decoder(root, name="gqa-static", seed=11, static_mask=True),
        )

    @pytest.fixture
    def genai_whisper_model_dir(self, tmp_path_factory: pytest.TempPathFactory) -> Path:
        """The tiny Whisper folder the speech area runs (`genai.testing.whisper`; always the
        suite's, whatever --genai-model says)."""
        return _cached_model(
            tmp_path_factory,
            "whisper",
            lambda root: write_whisper_fixture(root, "whisper", seed=SPEECH_SEED),
        )

    def vision_model_dir(self, tmp_path_factory: pytest.TempPathFactory, kind: str) -> Path:
        """The tiny vision-language folder of ``kind`` (`genai.testing.vision`)."""
        writers = {"phi3v": write_phi3v, "qwen2_5_vl": write_qwen2_5_vl}
        return _cached_model(tmp_path_factory, kind, lambda root: writers[kind](root, name=kind))

    @pytest.fixture
    def genai_provider_class(self, genai_provider_name: str) -> type[ExecutionProvider]:
        return get_provider_class(genai_provider_name)

    @pytest.fixture
    def genai_provider_probe(
        self, request: pytest.FixtureRequest, genai_provider_class: type[ExecutionProvider]
    ) -> ProbeResult:
        """The provider's availability probe, called once per pytest session (`probe`)."""
        return probe(request.config, genai_provider_class)

    @pytest.fixture
    def genai_provider(
        self, genai_provider_class: type[ExecutionProvider], genai_provider_probe: ProbeResult
    ) -> Iterator[ExecutionProvider]:
        provider = genai_provider_class()
        failure = genai_provider_probe.failure()
        if failure is not None:
            pytest.fail(f"provider {provider.name!r}: {failure}", pytrace=False)
        reason = genai_provider_probe.reason
        if reason is not None:
            pytest.skip(f"provider {provider.name!r} is unavailable: {reason}")
        yield provider

    @pytest.fixture(autouse=True)
    def _genai_requirements(
        self,
        request: pytest.FixtureRequest,
        genai_provider_name: str,
        genai_provider_options: dict[str, str],
    ) -> None:
        """Skip what the provider declares unsupported; xfail its declared known failures.
        (Requests the provider's name and options for every test: the report names them.)"""
        cls = get_provider_class(genai_provider_name)
        for requirement in getattr(request.function, "genai_requires", ()):
            reason = unsupported(cls, requirement)
            if reason:
                pytest.skip(reason)
        declared = cls.known_failures or {}
        name = request.function.__name__
        if name in declared:
            request.node.add_marker(pytest.mark.xfail(reason=declared[name], strict=False))

    # --- helpers ------------------------------------------------------------------------------
    def config(
        self,
        model_dir: Path,
        provider: str,
        options: Mapping[str, str] | None = None,
        **search: Any,
    ) -> genai.Config:
        """The model's config with only ``provider`` (and its options) and search overlays."""
        cfg = genai.Config(str(model_dir))
        cfg.clear_providers()
        cfg.append_provider(provider)
        for key, value in (options or {}).items():
            cfg.set_provider_option(provider, key, str(value))
        if search:
            cfg.overlay({"search": search})
        return cfg

    def model(
        self,
        model_dir: Path,
        provider: str,
        options: Mapping[str, str] | None = None,
        **search: Any,
    ) -> genai.Model:
        return genai.Model(self.config(model_dir, provider, options, **search))

    def provider_model(
        self,
        model_dir: Path,
        provider: ExecutionProvider,
        options: Mapping[str, str] | None,
        share: bool,
    ) -> genai.Model:
        """The model on the provider under test with the given KV layout."""
        return self.model(model_dir, provider.name, options, past_present_share_buffer=share)

    def model_pair(
        self,
        model_dir: Path,
        provider: ExecutionProvider,
        options: Mapping[str, str] | None,
        share: bool,
    ) -> tuple[genai.Model, genai.Model]:
        """The model on the provider under test, and on cpu (the parity baseline)."""
        return (
            self.provider_model(model_dir, provider, options, share),
            self.model(model_dir, "cpu", past_present_share_buffer=share),
        )

    def prompts(self, model: genai.Model, count: int = 2) -> list[list[int]]:
        """Deterministic prompts of different lengths, avoiding special ids."""
        vocab = model.io.vocab_size
        special = {int(model.config.get("model.pad_token_id", 0))}
        special |= {int(t) for t in model.config.eos_token_ids}
        bos = model.config.get("model.bos_token_id")
        if bos is not None:
            special.add(int(bos))
        pool = [t for t in range(min(vocab, 4096)) if t not in special and t > 3]
        out = []
        for row in range(count):
            length = 7 - 2 * row if row < 3 else 3
            out.append([pool[(5 * row + 7 * i + 3) % len(pool)] for i in range(length)])
        return out

    def generator(self, model: genai.Model, rows: Sequence[Sequence[int]], **search: Any):
        """A generator with ``rows`` appended (right-padded with pad_token_id)."""
        pad = int(model.config.get("model.pad_token_id", 0))
        width = max(len(r) for r in rows)
        tokens = np.full((len(rows), width), pad, dtype=np.int64)
        for i, row in enumerate(rows):
            tokens[i, : len(row)] = row
        params = genai.GeneratorParams(model)
        options = {"max_length": width + NEW_TOKENS + 8, "batch_size": len(rows), **search}
        params.set_search_options(**options)
        gen = genai.Generator(model, params)
        gen.append_tokens(tokens if len(rows) > 1 else tokens[0])
        return gen

    def input_generator(self, model: genai.Model, named: Any, batch: int = 1) -> Any:
        """A generator given a multimodal processor's output (``set_inputs``), with room for
        `NEW_TOKENS` more tokens."""
        length = np.asarray(named["input_ids"]).shape[-1]
        params = genai.GeneratorParams(model)
        params.set_search_options(max_length=length + NEW_TOKENS, batch_size=batch)
        gen = genai.Generator(model, params)
        gen.set_inputs(named)
        return gen

    def greedy(
        self, model: genai.Model, rows: Sequence[Sequence[int]], steps: int = NEW_TOKENS
    ) -> list[list[int]]:
        gen = self.generator(model, rows)
        out: list[list[int]] = [[] for _ in rows]
        for _ in range(steps):
            if gen.is_done():
                break
            gen.generate_next_token()
            for i, token in enumerate(gen.get_next_tokens()):
                out[i].append(int(token))
        return out

    def assert_parity(
        self,
        provider: ExecutionProvider,
        gen_p: Any,
        gen_c: Any,
        steps: int = NEW_TOKENS,
        what: str = "greedy decoding",
    ) -> None:
        """Step both generators together. Exact providers must choose the cpu provider's tokens;
        the others must keep every logit within ``logits_atol`` of the cpu provider's while the
        sequences agree, and may diverge only where the cpu provider's choice wins by at most
        twice that tolerance (a near tie)."""
        caps = provider.capabilities
        atol = caps.logits_atol
        what = f"{provider.name}: {what}"
        for step in range(steps):
            if gen_c.is_done() or gen_p.is_done():
                assert gen_c.is_done() == gen_p.is_done(), f"{what}: done differs at step {step}"
                return
            lc = gen_c.get_logits()[:, 0, :]
            lp = gen_p.get_logits()[:, 0, :]
            assert np.isfinite(lp).all(), f"{what}: non-finite logits at step {step}"
            if not caps.exact:
                worst = float(np.max(np.abs(lp - lc)))
                assert worst <= atol, (
                    f"{what}: logits differ from the cpu provider's by {worst:.3g} at step "
                    f"{step}, more than the declared logits_atol {atol:.3g}"
                )
            gen_c.generate_next_token()
            gen_p.generate_next_token()
            tc = gen_c.get_next_tokens()
            tp = gen_p.get_next_tokens()
            for row in np.flatnonzero(tc != tp):
                if caps.exact:
                    pytest.fail(
                        f"{what}: row {row} step {step}: token {int(tp[row])}, the cpu provider "
                        f"chose {int(tc[row])} (the provider declares exact parity)"
                    )
                margin = float(lc[row, tc[row]] - lc[row, tp[row]])
                assert margin <= 2 * atol, (
                    f"{what}: row {row} step {step}: token {int(tp[row])} instead of the cpu "
                    f"provider's {int(tc[row])}, which led by {margin:.3g} (> 2 x logits_atol)"
                )
            if (tc != tp).any():
                return  # the sequences diverged at a near tie: nothing more to compare

    def require(self, provider: type[ExecutionProvider] | ExecutionProvider, name: str) -> None:
        reason = unsupported(provider if isinstance(provider, type) else type(provider), name)
        if reason:
            pytest.skip(reason)

    def default_layout(self, provider: ExecutionProvider) -> bool:
        """past_present_share_buffer for tests that don't care: shared when supported."""
        return "shared" in provider.capabilities.kv_layouts


# ---------------------------------------------------------------------------------------------
# The areas
# ---------------------------------------------------------------------------------------------


class SessionCreationTests(ConformanceFixtures):
    """The provider registers, probes cheaply, and creates a session that really uses it."""

    def test_provider_is_registered(self, genai_provider_name: str) -> None:
        cls = get_provider_class(genai_provider_name)
        assert isinstance(cls, type) and issubclass(cls, ExecutionProvider), (
            f"{genai_provider_name!r} is registered as {cls!r}: expected an ExecutionProvider "
            "subclass"
        )
        assert cls.name and cls.ort_name, (
            f"{cls.__name__}: a provider needs a name and an ort_name (got name={cls.name!r}, "
            f"ort_name={cls.ort_name!r})"
        )
        described = cls().describe()
        assert described["name"] == cls.name, (
            f"{cls.name}: describe() names {described['name']!r}, expected {cls.name!r}"
        )
        for role in ("kv_cache", "inputs", "logits", "sampling"):
            where = getattr(cls.placement, role)
            assert where in ("cpu", cls.device), (
                f"{cls.name}: placement.{role} is {where!r}: must be 'cpu' or the provider's "
                f"device {cls.device!r}"
            )

    def test_probe_is_cheap_and_does_not_raise(
        self, genai_provider_class: type[ExecutionProvider], genai_provider_probe: ProbeResult
    ) -> None:
        """The probe loads no model (creates no ORT session), is quick, returns None or a
        reason, and says the same twice.

        Quick: the faster of two calls (the session's first, `probe`, and one more) within
        `probe_seconds`, a generous bound, as a first import of a large EP library may be
        slow; the probe runs at every model load.
        """
        name = genai_provider_class.name
        first = genai_provider_probe
        failure = first.failure()
        if failure is not None:
            pytest.fail(f"{name}: {failure}", pytrace=False)
        second = call_probe(genai_provider_class)
        assert not (first.sessions or second.sessions), (
            f"{name}: the availability probe created an ORT session (a probe loads no model)"
        )
        failure = second.failure()
        assert failure is None, f"{name}: called a second time, {failure}"
        reason = first.reason
        assert reason is None or (isinstance(reason, str) and reason.strip()), (
            f"{name}: unavailable_reason() returned {reason!r} ({type(reason).__name__}): "
            "expected None (available) or a non-empty str (why not)"
        )
        assert reason == second.reason, (
            f"{name}: the availability probe answered {reason!r}, then {second.reason!r}"
        )
        quickest = min(first.seconds, second.seconds)
        assert quickest <= self.probe_seconds, (
            f"{name}: the availability probe took {quickest:.1f} s (the faster of two calls), "
            f"over {self.probe_seconds:g} s: it runs at every model load, so it must be cheap "
            "(probe files and module specs, import lazily)"
        )

    def test_provider_is_available(
        self, genai_provider_class: type[ExecutionProvider], genai_provider_probe: ProbeResult
    ) -> None:
        name = genai_provider_class.name
        failure = genai_provider_probe.failure()
        if failure is not None:
            pytest.fail(f"{name}: {failure}", pytrace=False)
        reason = genai_provider_probe.reason
        assert reason is None, f"{name} is unavailable here: {reason}"

    def test_session_creation(
        self,
        genai_provider: ExecutionProvider,
        genai_provider_options: dict[str, str],
        genai_model_dir: Path,
    ) -> None:
        name = genai_provider.name
        model = self.model(genai_model_dir, name, genai_provider_options)
        assert model.provider.name == name, f"a model made for {name} runs on {model.provider.name}"
        expected = genai_provider.reference_device_type(model.provider_options)
        assert model.device_type == expected, (
            f"{name}: Model.device_type is {model.device_type!r}, expected {expected!r} "
            "(reference_device_type)"
        )
        gen = self.generator(model, self.prompts(model, 1))
        gen.generate_next_token()
        shape = gen.get_next_tokens().shape
        assert shape == (1,), f"{name}: one generated token has shape {shape}, expected (1,)"


class GreedyParityTests(ConformanceFixtures):
    """Greedy tokens equal the cpu provider's (exact), or logits within the declared
    tolerance."""

    def test_greedy_parity_with_cpu(
        self,
        genai_provider: ExecutionProvider,
        genai_provider_options: dict[str, str],
        genai_model_dir: Path,
    ) -> None:
        share = self.default_layout(genai_provider)
        model_p, model_c = self.model_pair(
            genai_model_dir, genai_provider, genai_provider_options, share
        )
        prompt = self.prompts(model_c, 1)
        self.assert_parity(
            genai_provider, self.generator(model_p, prompt), self.generator(model_c, prompt)
        )


class KVLayoutTests(ConformanceFixtures):
    """Both KV layouts (past_present_share_buffer true and false) match the cpu provider."""

    @pytest.mark.parametrize("layout", ["shared", "growing"])
    def test_kv_layout(
        self,
        layout: str,
        genai_provider: ExecutionProvider,
        genai_provider_options: dict[str, str],
        genai_model_dir: Path,
    ) -> None:
        self.require(genai_provider, f"kv_{layout}")
        share = layout == "shared"
        model_p, model_c = self.model_pair(
            genai_model_dir, genai_provider, genai_provider_options, share
        )
        prompt = self.prompts(model_c, 1)
        self.assert_parity(
            genai_provider,
            self.generator(model_p, prompt),
            self.generator(model_c, prompt),
            what=f"the {layout} KV layout",
        )


class BatchTests(ConformanceFixtures):
    """A right-padded batch gives each row the tokens it gets alone, and the cpu provider's."""

    @requires("batch")
    def test_batch_with_padding(
        self,
        genai_provider: ExecutionProvider,
        genai_provider_options: dict[str, str],
        genai_model_dir: Path,
    ) -> None:
        share = self.default_layout(genai_provider)
        model_p, model_c = self.model_pair(
            genai_model_dir, genai_provider, genai_provider_options, share
        )
        rows = self.prompts(model_c, 2)
        assert len(rows[0]) != len(rows[1]), "the suite's batch must need padding"
        self.assert_parity(
            genai_provider,
            self.generator(model_p, rows),
            self.generator(model_c, rows),
            what="a padded batch",
        )
        if genai_provider.capabilities.exact:
            batched = self.greedy(model_p, rows)
            for i, row in enumerate(rows):
                alone = self.greedy(model_p, [row])[0]
                assert batched[i] == alone, (
                    f"{genai_provider.name}: row {i} of a padded batch gave {batched[i]}, "
                    f"alone {alone}"
                )


class RewindContinuousTests(ConformanceFixtures):
    """Rewinding and appending more tokens after generating give the same tokens as one
    uninterrupted run."""

    @requires("continuous_decoding")
    def test_continuous_decoding(
        self,
        genai_provider: ExecutionProvider,
        genai_provider_options: dict[str, str],
        genai_model_dir: Path,
    ) -> None:
        share = self.default_layout(genai_provider)
        model = self.provider_model(genai_model_dir, genai_provider, genai_provider_options, share)
        first, second = self.prompts(model, 2)
        gen = self.generator(model, [first])
        for _ in range(4):
            gen.generate_next_token()
        gen.append_tokens(np.asarray(second, dtype=np.int64))
        history = gen.get_sequence(0).tolist()
        model_c = self.model(genai_model_dir, "cpu", past_present_share_buffer=share)
        # The same history appended at once, on the cpu provider.
        self.assert_parity(
            genai_provider,
            gen,
            self.generator(model_c, [history]),
            steps=8,
            what="continuous decoding",
        )

    @requires("rewind", "continuous_decoding")
    def test_rewind_then_append(
        self,
        genai_provider: ExecutionProvider,
        genai_provider_options: dict[str, str],
        genai_model_dir: Path,
    ) -> None:
        share = self.default_layout(genai_provider)
        model = self.provider_model(genai_model_dir, genai_provider, genai_provider_options, share)
        prompt = self.prompts(model, 1)[0]
        gen = self.generator(model, [prompt])
        for _ in range(10):
            gen.generate_next_token()
        full = gen.get_sequence(0).tolist()
        keep = len(prompt) + 3
        gen.rewind_to(keep)
        count = gen.token_count()
        assert count == keep, (
            f"{genai_provider.name}: after rewind_to({keep}) token_count() is {count}, "
            f"expected {keep}"
        )
        history = full[: keep + 2]
        gen.append_tokens(np.asarray(history[keep:], dtype=np.int64))
        sequence = gen.get_sequence(0).tolist()
        assert sequence == history, (
            f"{genai_provider.name}: after rewind_to({keep}) and appending "
            f"{history[keep:]}, the sequence is {sequence}, expected {history}"
        )
        # The tokens generated after the rewind against the cpu provider fed the same
        # history at once: exact providers choose its tokens, the others stay within their
        # declared logits tolerance (as in continuous decoding).
        model_c = self.model(genai_model_dir, "cpu", past_present_share_buffer=share)
        self.assert_parity(
            genai_provider,
            gen,
            self.generator(model_c, [history]),
            steps=len(full) - len(history),
            what="decoding after rewind_to + append",
        )
        if genai_provider.capabilities.exact:
            again = gen.get_sequence(0).tolist()
            assert again == full, (
                f"{genai_provider.name}: tokens after rewind {again}, first run {full}"
            )


class GraphCaptureTests(ConformanceFixtures):
    """Graph capture on gives the tokens graph capture off gives, and really captures."""

    @requires("graph_capture")
    def test_graph_capture_on_equals_off(
        self,
        genai_provider: ExecutionProvider,
        genai_provider_options: dict[str, str],
        genai_capture_model_dir: Path,
    ) -> None:
        name = genai_provider.name
        capture = genai_provider.graph_capture
        assert capture is not None, f"{name} declares graph capture, has graph_capture None"
        share = capture.requires_shared_buffer or self.default_layout(genai_provider)
        self.assert_capture_reaches_session(
            genai_provider, genai_provider_options, genai_capture_model_dir, share
        )
        blocker = genai_provider.graph_capture_blocker(rows=1, shared_kv=share)
        if blocker is not None:
            pytest.skip(f"{name} cannot capture a batch-1 generator: {blocker}")
        results = []
        for enabled in (False, True):
            options = {**genai_provider_options, **genai_provider.graph_capture_options(enabled)}
            model = self.model(
                genai_capture_model_dir,
                genai_provider.name,
                options,
                past_present_share_buffer=share,
            )
            prompt = self.prompts(model, 1)
            # two generators on one session: each binds its own buffers and graph
            runs = []
            for _ in range(2):
                # a small first KV capacity: the cache grows (new buffers) while capturing
                gen = self.generator(model, prompt, kv_initial_capacity=8)
                captured = bool(getattr(gen._loop, "capture", False))
                assert captured is enabled, (
                    f"{name}: graph capture {'on' if enabled else 'off'}: the engine "
                    f"{'did not capture' if enabled else 'captured'} the decode steps"
                )
                tokens = []
                while not gen.is_done() and len(tokens) < NEW_TOKENS:
                    gen.generate_next_token()
                    tokens.append(int(gen.get_next_tokens()[0]))
                runs.append(tokens)
            assert runs[0] == runs[1], (
                f"{name}: graph capture {'on' if enabled else 'off'}: two generators on one "
                f"session gave different tokens: {runs[0]}, {runs[1]}"
            )
            results.append(runs[0])
        assert results[0] == results[1], (
            f"{name}: graph capture changed the tokens: off {results[0]}, on {results[1]}"
        )

    def assert_capture_reaches_session(
        self,
        provider: ExecutionProvider,
        options: Mapping[str, str],
        model_dir: Path,
        share: bool,
    ) -> None:
        """The session spec with graph capture on differs from the one with it off as the
        provider's `GraphCapture` says: its ``option`` reaches the session (an EP option, or a
        session config entry named by it) as ``on`` when on, and not as ``on`` when off."""
        capture = provider.graph_capture
        assert capture is not None
        name, option = provider.name, capture.option
        specs = {}
        for enabled in (False, True):
            validated = provider.validate_options(
                {**options, **provider.graph_capture_options(enabled)}
            )
            assert provider.graph_capture_enabled(validated) is enabled, (
                f"{name}: graph_capture_enabled() is {not enabled} for options {validated} "
                f"({option}={capture.on if enabled else capture.off})"
            )
            config = self.config(model_dir, name, validated, past_present_share_buffer=share)
            specs[enabled] = provider.session_spec(validated, config)
        assert _spec_settings(specs[True]) != _spec_settings(specs[False]), (
            f"{name}: session_spec() is the same with graph capture on ({option}={capture.on}) "
            f"and off ({option}={capture.off}): the option its graph_capture declares never "
            "reaches the session (pass it as an EP option, or turn it into a session config "
            "entry)"
        )
        for enabled in (False, True):
            given = _capture_values(specs[enabled], option)
            if enabled and given and capture.on not in given:
                pytest.fail(
                    f"{name}: with graph capture on, session_spec() passes {option}="
                    f"{'/'.join(given)} to the session, expected {option}={capture.on}",
                    pytrace=False,
                )
            if not enabled and capture.on in given:
                pytest.fail(
                    f"{name}: with graph capture off ({option}={capture.off}), session_spec() "
                    f"still passes {option}={capture.on} to the session",
                    pytrace=False,
                )


def _spec_settings(spec: SessionSpec) -> tuple[Any, ...]:
    """A session spec's settings (EP options, config entries, fixed dimensions), comparable."""
    return (
        [dict(options) for _, options in spec.providers],
        dict(spec.config_entries),
        dict(spec.free_dimension_overrides),
    )


def _capture_values(spec: SessionSpec, option: str) -> list[str]:
    """The values ``spec`` gives ``option``: as an EP option, or as a session config entry
    named ``option`` or ending in ``.option`` (DirectML's ``ep.dml.enable_graph_capture``)."""
    values = [str(options[option]) for _, options in spec.providers if option in options]
    values += [
        str(value)
        for key, value in spec.config_entries.items()
        if key == option or key.endswith(f".{option}")
    ]
    return values


class SeededSamplingTests(ConformanceFixtures):
    """Sampling with a seed repeats itself; other seeds give other tokens."""

    @requires("seeded_sampling")
    def test_seeded_sampling_is_deterministic(
        self,
        genai_provider: ExecutionProvider,
        genai_provider_options: dict[str, str],
        genai_model_dir: Path,
    ) -> None:
        model = self.model(
            genai_model_dir,
            genai_provider.name,
            genai_provider_options,
            past_present_share_buffer=self.default_layout(genai_provider),
        )
        prompt = self.prompts(model, 1)

        def sample(seed: int) -> list[int]:
            gen = self.generator(
                model, prompt, do_sample=True, top_k=8, temperature=1.5, random_seed=seed
            )
            tokens = []
            while not gen.is_done() and len(tokens) < NEW_TOKENS:
                gen.generate_next_token()
                tokens.append(int(gen.get_next_tokens()[0]))
            return tokens

        name = genai_provider.name
        first = sample(1234)
        again = sample(1234)
        assert again == first, f"{name}: seed 1234 gave {first}, then {again}"
        assert any(sample(seed) != first for seed in (1, 2, 3)), (
            f"{name}: seeds 1234, 1, 2 and 3 all gave the same tokens {first}"
        )
        if genai_provider.capabilities.exact and genai_provider.name != "cpu":
            cpu = self.model(
                genai_model_dir,
                "cpu",
                past_present_share_buffer=self.default_layout(genai_provider),
            )
            gen = self.generator(
                cpu, prompt, do_sample=True, top_k=8, temperature=1.5, random_seed=1234
            )
            expected = []
            while not gen.is_done() and len(expected) < NEW_TOKENS:
                gen.generate_next_token()
                expected.append(int(gen.get_next_tokens()[0]))
            assert first == expected, (
                f"{name} (declares exact) sampled {first} with seed 1234; cpu sampled {expected}"
            )


class SpeechTests(ConformanceFixtures):
    """A tiny Whisper model (the encoder once, the decoder with cross-attention KV) gives the
    cpu provider's greedy tokens for a batch of two synthetic clips, their features made from
    `genai.Audios` by the model's multimodal processor."""

    @requires("speech")
    def test_whisper_greedy_parity_with_cpu(
        self,
        genai_provider: ExecutionProvider,
        genai_provider_options: dict[str, str],
        genai_whisper_model_dir: Path,
    ) -> None:
        reason = unsupported(type(genai_provider), "kv_growing")
        if reason:
            pytest.skip(f"{reason}; the Whisper decoder's self-attention cache is growing")
        model_c = self.model(genai_whisper_model_dir, "cpu")
        model_p = self.model(genai_whisper_model_dir, genai_provider.name, genai_provider_options)
        # two clips of different lengths (a batch of one for a provider without batching)
        clips = [synthetic_speech(1.5, seed=0), synthetic_speech(2.5, seed=1)]
        clips = clips[: 2 if genai_provider.capabilities.batch else 1]
        processor = model_c.create_multimodal_processor()
        named = processor([SPEECH_PROMPT] * len(clips), audios=genai.Audios.from_arrays(*clips))
        features = np.asarray(named["audio_features"])
        assert features.shape[0] == len(clips) and np.isfinite(features).all(), (
            f"the processor's audio_features (shape {features.shape}) are not {len(clips)} "
            "finite rows"
        )
        gen_c = self.input_generator(model_c, named, len(clips))
        first = gen_c.get_logits()[:, 0, :]
        # the check can only see the encoder if the clips change the decoder's logits
        assert len(clips) == 1 or not np.allclose(first[0], first[1], atol=0.1), (
            "the speech fixture's logits do not depend on its audio"
        )
        self.assert_parity(
            genai_provider,
            self.input_generator(model_p, named, len(clips)),
            gen_c,
            what=f"Whisper greedy decoding (batch {len(clips)})",
        )


class VisionTests(ConformanceFixtures):
    """Tiny vision-language models (vision, embedding and decoder graphs) give the cpu
    provider's greedy tokens for a prompt with a synthetic image (`genai.Images.open_bytes` of
    a PNG made here)."""

    @requires("vision")
    @pytest.mark.parametrize("kind", ["phi3v", "qwen2_5_vl"])
    def test_vision_greedy_parity_with_cpu(
        self,
        kind: str,
        genai_provider: ExecutionProvider,
        genai_provider_options: dict[str, str],
        tmp_path_factory: pytest.TempPathFactory,
    ) -> None:
        if kind == "qwen2_5_vl":
            # plain-op attention concatenating past and new keys: the growing layout only
            reason = unsupported(type(genai_provider), "kv_growing")
            if reason:
                pytest.skip(f"{reason}; the Qwen2.5-VL fixture's decoder needs it")
            share = False
        else:  # GroupQueryAttention takes either layout
            share = self.default_layout(genai_provider)
        try:
            png = synthetic_png()
        except MissingDependencyError as exc:
            pytest.skip(f"the vision area makes and decodes a PNG image: {exc}")
        folder = self.vision_model_dir(tmp_path_factory, kind)
        model_c = self.model(folder, "cpu", past_present_share_buffer=share)
        model_p = self.model(
            folder, genai_provider.name, genai_provider_options, past_present_share_buffer=share
        )
        processor = model_c.create_multimodal_processor()
        named = processor(VISION_PROMPTS[kind], images=genai.Images.open_bytes(png))
        assert int(np.asarray(named["num_image_tokens"]).sum()) > 0, (
            f"the {kind} processor gave no image tokens"
        )
        self.assert_parity(
            genai_provider,
            self.input_generator(model_p, named),
            self.input_generator(model_c, named),
            what=f"{kind} greedy decoding after an image prompt",
        )


class BufferPlacementTests(ConformanceFixtures):
    """Buffers live on the device the provider claims, and the session agrees."""

    def test_allocated_buffers_live_where_claimed(self, genai_provider: ExecutionProvider) -> None:
        name = genai_provider.name
        for role in ("kv_cache", "inputs", "logits"):
            buffer = genai_provider.allocate((1, 2, 3, 4), np.dtype(np.float32), role=role)
            claimed = getattr(genai_provider.placement, role)
            where = genai_provider.buffer_device(buffer)
            assert where == claimed, (
                f"{name}: allocate(role={role!r}) gave a {where} buffer "
                f"({type(buffer).__name__}); placement.{role} claims {claimed}"
            )
        zeros = genai_provider.allocate((2, 3), np.dtype(np.float32))
        if isinstance(zeros, np.ndarray):
            assert not zeros.any(), f"{name}: allocate(zero=True) gave a buffer not zeroed"

    def test_session_io_where_claimed(
        self,
        genai_provider: ExecutionProvider,
        genai_provider_options: dict[str, str],
        genai_model_dir: Path,
    ) -> None:
        model = self.model(genai_model_dir, genai_provider.name, genai_provider_options)
        # onnxruntime >= 1.23 (our floor) reports it: an error here is a failure.
        inputs = model.session.input_memory_info()
        outputs = model.session.output_memory_info()
        io = model.io
        checks = [("kv_cache", inputs, name) for name in (*io.past_keys, *io.past_values)]
        checks.append(("inputs", inputs, io.input_ids))
        checks.append(("logits", outputs, io.logits))
        problems = []
        for role, table, name in checks:
            info = table.get(name)
            if info is None:
                continue
            wants_host = info["device_type"] == "CPU"
            claims_host = getattr(genai_provider.placement, role) == "cpu"
            if role != "kv_cache" and claims_host:
                # Inputs (a few ids) and logits (which a host sampler reads anyway) may be
                # staged on the host: one small copy per step. The KV cache may not.
                continue
            if wants_host != claims_host:
                problems.append(
                    f"{name}: the session keeps it in {info['name']} memory, the provider "
                    f"places {role} on {getattr(genai_provider.placement, role)}"
                )
        assert not problems, (
            f"{genai_provider.name}: buffers are not where the session runs them (a copy every "
            "step): " + "; ".join(problems)
        )
        if genai_provider.placement.kv_cache != "cpu":
            # The engine keeps what the provider claims: after a step the pasts bound to the
            # session are in device memory (the presents of the run before, or the shared
            # buffers), whichever KV layout the model asks for.
            layouts = genai_provider.capabilities.kv_layouts
            for share in [s for s in (True, False) if ("shared" if s else "growing") in layouts]:
                model = self.model(
                    genai_model_dir,
                    genai_provider.name,
                    genai_provider_options,
                    past_present_share_buffer=share,
                )
                gen = self.generator(model, [list(range(3, 9))])
                gen.generate_next_token()
                assert gen._session.bound_input_in_device_memory(io.past_keys[0]), (
                    f"{genai_provider.name} places kv_cache on its device "
                    f"({genai_provider.placement.kv_cache}) but the engine keeps it on the host "
                    f"(past_present_share_buffer={share})"
                )


class ErrorTests(ConformanceFixtures):
    """Misuse fails loudly with a message naming the problem; no silent CPU fallback."""

    def test_unknown_option_is_rejected(
        self,
        genai_provider: ExecutionProvider,
        genai_provider_options: dict[str, str],
        genai_model_dir: Path,
    ) -> None:
        if genai_provider.known_options is None:
            pytest.skip(f"{genai_provider.name} passes options through to onnxruntime unchecked")
        options = {**genai_provider_options, "genai_conformance_no_such_option": "1"}
        with pytest.raises(ConfigError, match="genai_conformance_no_such_option"):
            self.model(genai_model_dir, genai_provider.name, options)

    def test_unavailable_provider_is_an_error_not_a_fallback(
        self,
        genai_provider_class: type[ExecutionProvider],
        genai_model_dir: Path,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        monkeypatch.setattr(
            genai_provider_class, "unavailable_reason", lambda self: "simulated: no such device"
        )
        with pytest.raises(ProviderUnavailableError) as info:
            self.model(genai_model_dir, genai_provider_class.name)
        name = genai_provider_class.name
        assert name in str(info.value) and "simulated: no such device" in str(info.value), (
            f"{name}: the error for an unavailable provider names neither it nor the probe's "
            f"reason ('simulated: no such device'): {info.value}"
        )

    def test_unknown_provider_name_is_an_error(self, genai_model_dir: Path) -> None:
        with pytest.raises(ProviderUnavailableError, match="no installed plugin provides it"):
            self.model(genai_model_dir, "genai-conformance-no-such-provider")

    def test_misuse_is_reported(
        self,
        genai_provider: ExecutionProvider,
        genai_provider_options: dict[str, str],
        genai_model_dir: Path,
    ) -> None:
        model = self.model(genai_model_dir, genai_provider.name, genai_provider_options)
        params = genai.GeneratorParams(model)
        with pytest.raises((SearchOptionError, ValueError)):
            params.set_search_options(max_length=model.config.context_length + 1)
            genai.Generator(model, params)
        params = genai.GeneratorParams(model)
        params.set_search_options(max_length=16)
        gen = genai.Generator(model, params)
        with pytest.raises(GenerationError):
            gen.generate_next_token()


class ProviderConformanceTests(
    # pytest runs a class's inherited tests from the last base to the first: this order runs
    # session creation first and error handling last.
    ErrorTests,
    BufferPlacementTests,
    VisionTests,
    SpeechTests,
    SeededSamplingTests,
    GraphCaptureTests,
    RewindContinuousTests,
    BatchTests,
    KVLayoutTests,
    GreedyParityTests,
    SessionCreationTests,
):
    """Every conformance test: subclass this one (named ``Test...``) to run the whole suite."""
