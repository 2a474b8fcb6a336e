"""Bad input to the Generator gets a clear Python exception naming the problem."""

from __future__ import annotations

import numpy as np
import pytest

import genai


@pytest.fixture(scope="module")
def model(fixture_folders):
    return genai.Model(fixture_folders["gqa"])


def make(model, **options):
    params = genai.GeneratorParams(model)
    params.set_search_options(**{"max_length": 16, **options})
    return genai.Generator(model, params)


def test_generate_before_append(model):
    with pytest.raises(genai.GenerationError, match="no prior state: call append_tokens first"):
        make(model).generate_next_token()


def test_get_logits_before_append(model):
    with pytest.raises(genai.GenerationError, match="append_tokens"):
        make(model).get_logits()


@pytest.mark.parametrize("bad", [64, 1000, -1])
def test_token_id_out_of_vocabulary(model, bad):
    with pytest.raises(ValueError, match=rf"token id {bad} is outside the vocabulary \[0, 64\)"):
        make(model).append_tokens(np.array([5, bad], np.int32))


def test_wrong_dtype(model):
    with pytest.raises(TypeError, match="tokens must be integers, got dtype float32"):
        make(model).append_tokens(np.array([1.0, 2.0], np.float32))


def test_wrong_rank(model):
    with pytest.raises(ValueError, match=r"1-D or \[batch, length\]"):
        make(model).append_tokens(np.zeros((1, 2, 3), np.int32))


def test_wrong_batch_rows(model):
    with pytest.raises(ValueError, match="tokens have 3 rows but batch_size is 2"):
        make(model, batch_size=2).append_tokens(np.ones((3, 4), np.int32))


def test_append_beyond_max_length(model):
    generator = make(model)
    generator.append_tokens(np.arange(3, 13, dtype=np.int32))
    with pytest.raises(ValueError, match="exceeds max_length 16"):
        generator.append_tokens(np.arange(3, 10, dtype=np.int32))
    # a chat app written for the reference catches its RuntimeError when the conversation
    # outgrows max_length
    with pytest.raises(RuntimeError, match="exceeds max_length 16"):
        generator.append_tokens(np.arange(3, 10, dtype=np.int32))


def test_generate_past_max_length_stops(model):
    generator = make(model, max_length=8)
    generator.append_tokens(np.arange(3, 8, dtype=np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    assert generator.token_count() == 8
    with pytest.raises(genai.GenerationError, match="max_length 8"):
        generator.generate_next_token()


def test_set_logits_checks_shape_and_dtype(model):
    generator = make(model)
    with pytest.raises(TypeError, match="float32"):
        generator.set_logits(np.zeros((1, 64), np.float64))
    with pytest.raises(ValueError, match="vocab=64"):
        generator.set_logits(np.zeros((1, 63), np.float32))


def test_set_logits_drives_the_choice(model):
    """Logits injected before any model run choose the token (the reference's logits tests)."""
    generator = make(model)
    logits = np.zeros((1, 1, 64), np.float32)
    logits[0, 0, 42] = 5.0
    generator.set_logits(logits)
    generator.generate_next_token()
    assert generator.get_next_tokens().tolist() == [42]


def test_nan_logits_are_an_error(model):
    generator = make(model)
    logits = np.zeros((1, 64), np.float32)
    logits[0, 7] = np.nan
    generator.set_logits(logits)
    with pytest.raises(ValueError, match="NaN"):
        generator.generate_next_token()


def test_unknown_output_name(model):
    generator = make(model)
    generator.append_tokens(np.array([5, 6], np.int32))
    with pytest.raises(KeyError, match="no_such_output"):
        generator.get_output("no_such_output")


def test_rewind_out_of_range(model):
    generator = make(model)
    generator.append_tokens(np.array([5, 6, 7], np.int32))
    with pytest.raises(ValueError, match="cannot rewind to 4"):
        generator.rewind_to(4)


def test_every_genai_error_class_shares_one_base():
    """GenaiError is the base of every exception class genai defines, each keeping the
    built-in base callers (and the reference) expect."""
    import genai.builder.errors
    import genai.constraints.guidance
    import genai.providers.plugins
    import genai.runtime.adapters
    import genai.serve.scheduler
    import genai.text.chat_template
    from genai import errors
    from genai.compat.unsupported import not_implemented

    expected = {
        errors.ConfigError: ValueError,
        errors.SearchOptionError: ValueError,
        errors.InvalidArgumentError: ValueError,
        errors.GenerationError: RuntimeError,
        errors.ProviderUnavailableError: RuntimeError,
        errors.UnsupportedFeatureError: NotImplementedError,
        errors.ArgumentTypeError: TypeError,
        errors.ModelError: RuntimeError,
        errors.MissingDependencyError: RuntimeError,
        errors.DownloadError: RuntimeError,
        errors.TensorNotFoundError: KeyError,
        errors.NonFiniteLogitsError: ValueError,
        genai.runtime.adapters.AdapterError: ValueError,
        genai.runtime.adapters.AdapterInUseError: RuntimeError,
        genai.text.chat_template.ChatTemplateError: ValueError,
        genai.constraints.guidance.GuidanceError: ValueError,
        genai.providers.plugins.PluginError: RuntimeError,
        genai.builder.errors.BuildError: ValueError,
        genai.serve.scheduler.QueueFullError: RuntimeError,
    }
    for cls, builtin in expected.items():
        assert issubclass(cls, errors.GenaiError) and issubclass(cls, builtin), cls
    # where the reference raises RuntimeError for the same input, so is ours
    assert issubclass(errors.SearchOptionError, RuntimeError)
    assert issubclass(errors.LengthLimitError, RuntimeError)
    error = not_implemented("StreamingProcessor.process", "speech")
    assert isinstance(error, errors.UnsupportedFeatureError) and isinstance(
        error, NotImplementedError
    )
    assert "StreamingProcessor.process" in str(error) and "docs/differences.md" in str(error)


@pytest.mark.parametrize(
    ("tokens", "batch", "message"),
    [
        ([], 1, "append_tokens needs at least one token"),
        (np.zeros((1, 0), np.int32), 1, "append_tokens needs at least one token"),
        ([[1, 2], [3]], 2, "rectangular"),
    ],
)
def test_empty_or_ragged_tokens(model, tokens, batch, message):
    with pytest.raises(ValueError, match=message):
        make(model, batch_size=batch).append_tokens(tokens)


@pytest.mark.parametrize("bad", [1.5, "2", None])
def test_lengths_and_indices_must_be_ints(model, bad):
    generator = make(model)
    generator.append_tokens(np.array([5, 6, 7], np.int32))
    generator.generate_next_token()
    for call in (generator.rewind_to, generator.truncate, generator.get_sequence):
        with pytest.raises(genai.ArgumentTypeError, match="must be an int, not"):
            call(bad)
    generator.rewind_to(np.int64(2))  # NumPy integers are ints
    assert generator.get_sequence(np.int32(0)).tolist() == [5, 6]


def test_constructors_check_their_argument_types(model, fixture_folders):
    params = genai.GeneratorParams(model)
    with pytest.raises(genai.ArgumentTypeError, match="model must be a genai.Model, not str"):
        genai.Generator(str(fixture_folders["gqa"]), params)
    with pytest.raises(genai.ArgumentTypeError, match="params must be a genai.GeneratorParams"):
        genai.Generator(model, None)
    with pytest.raises(genai.ArgumentTypeError, match="model must be a genai.Model, not str"):
        genai.GeneratorParams(str(fixture_folders["gqa"]))


def test_removing_model_data_never_added_is_an_error(fixture_folders):
    config = genai.Config(fixture_folders["gqa"])
    with pytest.raises(RuntimeError, match="Model data for 'nothing.onnx' was not found."):
        config.remove_model_data("nothing.onnx")
