"""genai's genai_config.json schema against the reference's (onnxruntime-genai 0.18).

The reference's keys come from ``tests/data/onnxruntime_genai_0_18_config_keys.tsv`` (how it
was extracted is in its header); every line is checked to be known to the installed reference
(it answers 'Unknown value' for a key it does not know, checked here too), and genai's schema
must know the same keys with the same types. Keys of features genai does not run are accepted
by the parser and refused when a `Model` loads, naming the feature.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

import genai
from genai.runtime import config as config_module
from genai.runtime.config import SCHEMA, UNSUPPORTED_KEYS

KEYS_FILE = Path(__file__).parent / "data" / "onnxruntime_genai_0_18_config_keys.tsv"

BASE = {
    "model": {
        "type": "llama",
        "context_length": 64,
        "vocab_size": 10,
        "decoder": {"filename": "model.onnx", "inputs": {}, "outputs": {}},
    },
    "search": {},
}


def reference_keys() -> dict[str, str]:
    """``dotted path -> kind`` from the vendored list."""
    keys = {}
    for line in KEYS_FILE.read_text().splitlines():
        if line and not line.startswith("#"):
            path, kind = line.split("\t")
            keys[path] = kind
    return keys


def write(folder: Path, doc: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "genai_config.json").write_text(json.dumps(doc))
    (folder / "model.onnx").write_bytes(b"")
    return folder


# --- documents for one key
def _tokens(path: str) -> list[str | None]:
    """``a.b[].*`` -> ["a", "b", None, "k"]: names, None for an array's item; "*" becomes "k"."""
    tokens: list[str | None] = []
    for segment in path.split("."):
        name = segment.replace("[]", "")
        tokens.append("k" if name == "*" else name)
        tokens.extend([None] * segment.count("[]"))
    return tokens


def _nest(tokens: list[str | None], value: Any) -> Any:
    for token in reversed(tokens):
        value = [value] if token is None else {token: value}
    return value


def probe_doc(path: str, value: Any) -> dict[str, Any]:
    """A document that holds only ``path`` (set to ``value``)."""
    return _nest(_tokens(path), value)


_SAMPLE_STRINGS = {
    "graph_optimization_level": "ORT_ENABLE_ALL",
    "hardware_device_type": "gpu",
    "sampled_proposal": "none",
    "kind": "paged_kv",
    "alignment": "right",
}


def sample(path: str, kind: str) -> Any:
    """A valid value of ``kind`` for the key at ``path``."""
    last = _tokens(path)[-1] or ""
    if kind == "string":
        return _SAMPLE_STRINGS.get(last, "x")
    if kind == "int":
        return 0 if path.endswith("layers") else 2
    if kind == "number":
        return 0.5 if last and "token" not in last else 2
    if kind == "bool":
        return not last.startswith("slide_")
    if kind == "object":
        return {}
    return []


def _complete(node: Any, parents: tuple[str, ...] = ()) -> None:
    """Give a probe document the siblings genai's checks need beside the probed key (a
    sliding window's size, a pipeline stage's file, a state group's kind)."""
    if isinstance(node, list):
        for item in node:
            _complete(item, parents)
        return
    if not isinstance(node, dict):
        return
    if parents[-1:] == ("sliding_window",):
        node.setdefault("window_size", 4)
        # the two slides default to true (the reference's defaults); genai slides both or
        # neither: the probed one's sibling takes its value, else both are off (GQA windows)
        slides = ("slide_key_value_cache", "slide_inputs")
        given = [node[key] for key in slides if key in node]
        for key in slides:
            node.setdefault(key, given[0] if given else False)
    if parents[-1:] == ("state_groups",):
        node.setdefault("kind", "paged_kv")
        node.setdefault("layer_ids", [0])
    if parents[-3:-1] in (("decoder", "pipeline"), ("draft", "pipeline")):
        node.setdefault("filename", "stage.onnx")
    for key, value in node.items():
        _complete(value, (*parents, key))


def genai_doc(path: str, kind: str) -> dict[str, Any]:
    """A complete document (`BASE` + ``path`` set to a valid value of ``kind``)."""
    doc = copy.deepcopy(BASE)
    patch = probe_doc(path, sample(path, kind))
    _complete(patch)
    _merge(doc, patch)
    return doc


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = value


# --- genai's schema, walked into the list's notation
def _kind(node: Any) -> str:
    if isinstance(node, tuple):
        names = {str: "string", int: "int", bool: "bool"}
        return "number" if float in node else names[node[0]]
    if isinstance(node, config_module._ListOf | config_module._ProviderOptions):
        return "array"
    if isinstance(node, config_module._IntOrList):
        return "array|int"
    if isinstance(node, config_module._Stages):
        return "array|object"
    return "object"


def genai_keys(node: Any = SCHEMA, path: str = "") -> dict[str, str]:
    """``dotted path -> kind`` for every key genai's `SCHEMA` accepts."""
    keys: dict[str, str] = {}

    def add(where: str, child: Any) -> None:
        keys[where] = _kind(child)
        keys.update(genai_keys(child, where))

    if node == config_module.ANY_STRINGS:
        keys[f"{path}.*"] = "string"
    elif isinstance(node, dict):
        for key, child in node.items():
            add(f"{path}.{key}" if path else key, child)
    elif isinstance(node, config_module._ListOf):
        add(f"{path}[]", node.item)
    elif isinstance(node, config_module._IntOrList):
        keys[f"{path}[]"] = "int"
    elif isinstance(node, config_module._Stages):
        keys[f"{path}[]"] = keys[f"{path}.*"] = keys[f"{path}[].*"] = "object"
        keys.update(genai_keys(node.stage, f"{path}.*"))
        keys.update(genai_keys(node.stage, f"{path}[].*"))
    elif isinstance(node, config_module._ProviderOptions):
        keys[f"{path}[]"] = keys[f"{path}[].*"] = "object"
        keys[f"{path}[].*.*"] = "string"
        add(f"{path}[].*.device_filtering_options", config_module._DEVICE_FILTERING)
    return keys


#: Where genai's schema differs from the reference's on purpose.
DELIBERATE = {
    # fractional chunk sizes (the reference truncates them) are refused
    "search.chunk_size": "int",
    # Moonshine graphs' names cannot all be read back from the reference's binary: any name
    **{
        f"model.moonshine.{graph}.{side}.*": "string"
        for graph in ("encoder", "adapter", "cross_kv", "decoder_kv")
        for side in ("inputs", "outputs")
    },
}


def _deliberate(path: str) -> str | None:
    """genai's kind for ``path`` when it differs from the reference's on purpose."""
    return DELIBERATE.get(path.removeprefix(_PROFILE))


def _lenient(path: str) -> bool:
    """genai checks a runtime profile's overlay against the whole document's schema (the
    reference refuses some keys there; genai refuses every profile when a model loads)."""
    return path.startswith(_PROFILE)


_PROFILE = "runtime_profiles[].overlay."


def _covered(path: str, kind: str, keys: dict[str, str]) -> bool:
    """``path`` is in ``keys`` with ``kind``, directly or through a "*" sibling."""
    same = {"int", "number"} if path.endswith("[]") else {kind}  # items: probed with 1
    if path in keys:
        return keys[path] in same | {kind} or (kind in same and keys[path] in same)
    parent, _, _ = path.rpartition(".")
    return keys.get(f"{parent}.*") == kind


def test_every_reference_key_is_in_genais_schema() -> None:
    """The test that fails when the reference knows a key (or a type) genai does not."""
    ours = genai_keys()
    missing = [
        f"{path} ({kind})"
        for path, kind in reference_keys().items()
        if not _covered(path, kind, ours) and _deliberate(path) is None
    ]
    assert not missing, "keys the reference accepts and genai does not:\n" + "\n".join(missing)


def test_genai_accepts_no_key_the_reference_does_not() -> None:
    theirs = reference_keys()
    extra = [
        f"{path} ({kind})"
        for path, kind in genai_keys().items()
        if not _covered(path, kind, theirs) and _deliberate(path) != kind and not _lenient(path)
    ]
    assert not extra, "keys genai accepts and the reference does not:\n" + "\n".join(extra)


def test_genai_loads_every_reference_key(tmp_path: Path) -> None:
    """Each key, alone beside a minimal model, loads in genai's `Config` (and reads back)."""
    failures = []
    for index, (path, kinds) in enumerate(reference_keys().items()):
        for kind in kinds.split("|"):
            if _deliberate(path) not in (None, kind):
                continue
            folder = write(tmp_path / str(index), genai_doc(path, kind))
            try:
                genai.Config(folder)
            except Exception as exc:  # collected: one report for every key that fails
                failures.append(f"{path} ({kind}): {exc}")
    assert not failures, "\n".join(failures)


# --- the list against the installed reference
@pytest.fixture(scope="module")
def og() -> Any:
    return pytest.importorskip("onnxruntime_genai", reason="reference engine not installed")


@pytest.fixture(scope="module")
def reference_base(og: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(tmp_path_factory.mktemp("reference"), BASE)


def reference_error(og: Any, folder: Path, doc: dict[str, Any]) -> str | None:
    """The reference's error for overlaying ``doc`` on the folder's config (None: accepted)."""
    config = og.Config(str(folder))
    try:
        config.overlay(json.dumps(doc))
    except Exception as exc:  # the reference raises RuntimeError
        return str(exc)
    return None


def test_the_reference_refuses_unknown_keys(og: Any, reference_base: Path) -> None:
    """The premise of the list: an unknown key anywhere is an error naming it."""
    for path in ("bogus", "model.bogus", "model.decoder.inputs.bogus", "search.bogus"):
        error = reference_error(og, reference_base, probe_doc(path, {}))
        assert error is not None and 'Unknown value "bogus"' in error, (path, error)
        with pytest.raises(genai.ConfigError, match="unknown key"):
            genai.Config(reference_base).overlay(probe_doc(path, {}))


def test_every_listed_key_is_known_to_the_reference(og: Any, reference_base: Path) -> None:
    """Each line of the vendored list: the installed reference knows the key. A scalar is
    probed with a string (a known number or bool answers 'Expected a number/bool', never
    'Unknown value'), an object with {} and an array with []."""
    unknown = []
    for path, kinds in reference_keys().items():
        name = _tokens(path)[-1] or path.rsplit(".", 1)[-1].replace("[]", "")
        for kind in kinds.split("|"):
            value = {"object": {}, "array": []}.get(kind, "x")
            error = reference_error(og, reference_base, probe_doc(path, value))
            if error is not None and f'Unknown value "{name}"' in error:
                unknown.append(f"{path} ({kind}): {error}")
    assert not unknown, "\n".join(unknown)


# --- features genai does not run: accepted by the parser, refused at load
def _unsupported_doc(key: str) -> dict[str, Any]:
    """A document asking for the feature: the key with a value (a list with one item)."""
    kind = reference_keys()[key].split("|")[-1]
    if kind != "array":
        return genai_doc(key, kind)
    doc = copy.deepcopy(BASE)
    patch = probe_doc(key, [{}])
    _complete(patch)
    _merge(doc, patch)
    return doc


@pytest.mark.parametrize("key", list(UNSUPPORTED_KEYS))
def test_unsupported_feature_refused_at_load_naming_it(tmp_path: Path, key: str) -> None:
    folder = write(tmp_path, _unsupported_doc(key))
    config = genai.Config(folder)  # the parser accepts it
    assert config.get(key) is not None
    feature = UNSUPPORTED_KEYS[key]
    with pytest.raises(NotImplementedError) as info:
        genai.Model(folder)
    message = str(info.value)
    assert key.rsplit(".", 1)[-1] in message
    assert " ".join(feature.name.split()[:3]) in message


@pytest.mark.parametrize("key", list(UNSUPPORTED_KEYS))
def test_unsupported_keys_are_reference_keys(key: str) -> None:
    assert key in reference_keys()


@pytest.mark.parametrize("key", [k for k in UNSUPPORTED_KEYS if reference_keys()[k] == "array"])
def test_an_empty_list_asks_for_nothing(tmp_path: Path, key: str) -> None:
    config = genai.Config(write(tmp_path, genai_doc(key, "array")))
    assert config.get(key) == []
    config.check_supported()


def test_check_supported_names_every_key(tmp_path: Path) -> None:
    doc = genai_doc("model.dflash2", "object")
    _merge(doc, probe_doc("model.decoder.inputs.block_table", "block_table"))
    config = genai.Config(write(tmp_path, doc))
    assert [key for key, _ in config.unsupported_features()] == [
        "model.dflash2",
        "model.decoder.inputs.block_table",
    ]
    with pytest.raises(NotImplementedError, match=r"model\.dflash2 .*also: .*block_table"):
        config.check_supported()


# --- Config methods of the reference
def test_config_has_every_method_of_the_reference(og: Any) -> None:
    theirs = {name for name in dir(og.Config) if not name.startswith("_")}
    assert theirs - set(dir(genai.Config)) == set()


def _with_cuda(og: Any, folder: Path) -> tuple[Any, genai.Config]:
    reference = og.Config(str(folder))
    reference.append_provider("cuda")
    ours = genai.Config(folder)
    ours.append_provider("cuda")
    return reference, ours


@pytest.mark.parametrize("value", ["gpu", "GPU", "cpu", "Npu", "xpu", "", "gpu "])
def test_hardware_device_type_accepted_as_the_reference(
    og: Any, reference_base: Path, value: str
) -> None:
    reference, ours = _with_cuda(og, reference_base)
    try:
        reference.set_decoder_provider_options_hardware_device_type("cuda", value)
        accepted = True
    except RuntimeError:
        accepted = False
    if accepted:
        ours.set_decoder_provider_options_hardware_device_type("cuda", value)
        assert ours.device_filtering_options("cuda") == {"hardware_device_type": value}
    else:
        with pytest.raises(genai.ConfigError, match="hardware device type"):
            ours.set_decoder_provider_options_hardware_device_type("cuda", value)


@pytest.mark.parametrize("value", [0, 1, 4318, 2**32 - 1, -1, 2**32])
@pytest.mark.parametrize("field", ["device_id", "vendor_id"])
def test_hardware_ids_accepted_as_the_reference(
    og: Any, reference_base: Path, field: str, value: int
) -> None:
    reference, ours = _with_cuda(og, reference_base)
    name = f"set_decoder_provider_options_hardware_{field}"
    try:
        getattr(reference, name)("cuda", value)
        accepted = True
    except (TypeError, RuntimeError):
        accepted = False
    if accepted:
        getattr(ours, name)("cuda", value)
        assert ours.device_filtering_options("cuda") == {f"hardware_{field}": value}
    else:
        with pytest.raises(genai.ConfigError, match=f"hardware_{field}"):
            getattr(ours, name)("cuda", value)


def test_device_filtering_set_cleared_and_kept_out_of_provider_options(tmp_path: Path) -> None:
    config = genai.Config(write(tmp_path, BASE))
    config.set_decoder_provider_options_hardware_device_type("cuda", "gpu")  # not in the list
    assert config.device_filtering_options("cuda") == {}
    config.set_provider_option("cuda", "device_id", "0")
    config.set_decoder_provider_options_hardware_device_type("CUDAExecutionProvider", "gpu")
    config.set_decoder_provider_options_hardware_device_id("cuda", 1)
    config.set_decoder_provider_options_hardware_vendor_id("cuda", 4318)
    assert config.device_filtering_options("cuda") == {
        "hardware_device_type": "gpu",
        "hardware_device_id": 1,
        "hardware_vendor_id": 4318,
    }
    assert config.providers == [("cuda", {"device_id": "0"})]  # plain options only
    config.clear_decoder_provider_options_hardware_device_id("cuda")
    config.clear_decoder_provider_options_hardware_vendor_id("cuda")
    assert config.device_filtering_options("cuda") == {"hardware_device_type": "gpu"}
    config.clear_decoder_provider_options_hardware_device_type("cuda")
    assert config.device_filtering_options("cuda") == {}


def test_device_filtering_options_in_a_file_load_in_both(og: Any, tmp_path: Path) -> None:
    doc = copy.deepcopy(BASE)
    options = {"device_id": "0", "device_filtering_options": {"hardware_device_type": "GPU"}}
    doc["model"]["decoder"]["session_options"] = {"provider_options": [{"cuda": options}]}
    folder = write(tmp_path, doc)
    og.Config(str(folder))
    config = genai.Config(folder)
    assert config.providers == [("cuda", {"device_id": "0"})]
    assert config.device_filtering_options("cuda") == {"hardware_device_type": "GPU"}
    doc["model"]["decoder"]["session_options"]["provider_options"][0]["cuda"][
        "device_filtering_options"
    ]["hardware_device_type"] = "tpu"
    write(tmp_path, doc)
    with pytest.raises(RuntimeError, match="tpu"):
        og.Config(str(folder))
    with pytest.raises(genai.ConfigError, match="tpu"):
        genai.Config(folder)


def _package(folder: Path) -> Path:
    """A folder shaped as the reference's model packages: manifest.json, no root config."""
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"name": "m", "components": []}))
    write(folder / "variant", BASE)
    return folder


def test_from_package_ep_refuses_a_plain_folder_as_the_reference(
    og: Any, reference_base: Path
) -> None:
    with pytest.raises(RuntimeError, match="not a model package"):
        og.Config.from_package_ep(str(reference_base), "cpu")
    with pytest.raises(genai.ConfigError, match="not a model package"):
        genai.Config.from_package_ep(reference_base, "cpu")


def test_model_packages_refused_as_unsupported(og: Any, tmp_path: Path) -> None:
    package = _package(tmp_path / "package")
    with pytest.raises(RuntimeError):  # this reference build has no package support either
        og.Config.from_package_ep(str(package), "cpu")
    with pytest.raises(RuntimeError):
        og.Config(str(package))
    with pytest.raises(NotImplementedError, match="model package"):
        genai.Config.from_package_ep(package, "cpu")
    with pytest.raises(NotImplementedError, match="model package"):
        genai.Config(package)


def test_top_level_scalars_ignored_as_the_reference(og: Any, tmp_path: Path) -> None:
    doc = {**copy.deepcopy(BASE), "comment": "built by hand", "version": 2}
    folder = write(tmp_path, doc)
    og.Config(str(folder))
    config = genai.Config(folder)
    assert "comment" not in config.to_dict()
    assert config.get("model.type") == "llama"
