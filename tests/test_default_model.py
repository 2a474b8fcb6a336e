"""``genai.default_model()``: the public spelling of the folder ``genai pull`` builds."""

from __future__ import annotations

import subprocess
import sys

import pytest

import genai
from genai.builder import pull


def test_default_model_is_the_pulled_folder_and_the_reference_loads_it(default_model_path):
    og_ref = pytest.importorskip("onnxruntime_genai")
    path = genai.default_model(progress=False)
    assert isinstance(path, str)
    assert path == str(default_model_path)
    ref_model = og_ref.Model(path)  # the reference reads the same folder from the same spelling
    ref_tokenizer = og_ref.Tokenizer(ref_model)
    assert len(ref_tokenizer.encode("Paris")) > 0


def test_default_model_names_the_cache_folder_when_it_cannot_pull(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("GENAI_CACHE_DIR", str(blocker))
    with pytest.raises(genai.DownloadError) as info:
        genai.default_model(progress=False)
    message = str(info.value)
    assert str(blocker / "models" / pull.DEFAULT_MODEL_NAME) in message
    assert "genai pull" in message


def test_default_model_is_exported_without_loading_the_builder_on_import():
    code = (
        "import sys, genai\n"
        "assert 'genai.builder' not in sys.modules, 'import genai loaded the builder'\n"
        "assert 'default_model' in genai.__all__\n"
        "from genai import default_model\n"
        "assert default_model.__module__ == 'genai.builder.pull'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
