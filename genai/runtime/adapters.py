"""Multi-LoRA: `Adapters` loads onnxruntime ``.onnx_adapter`` files for a model, and
``Generator.set_active_adapter(adapters, name)`` makes a generator run with them.

A model that takes adapters has LoRA weights as graph inputs (``...lora_A...`` ``[in, rank]`` and
``...lora_B...`` ``[rank, out]`` pairs, see `genai.runtime.model.LoraInput`). Every generator binds
rank-0 arrays to them (the branch adds exact zeros: the base model); activating adapters binds
that generator's own arrays, so generators on one model run different adapters side by side.
Several adapters active on one generator are concatenated along the rank axis, which adds their
deltas: ``x @ [A1 A2] @ [B1; B2] = x @ A1 @ B1 + x @ A2 @ B2``.

A parameter may also name any other input of the graph (`genai.runtime.model.AdapterInput`: an input
genai does not feed itself, or an overridable initializer), as the reference binds an adapter's
parameters by name (e.g. its test models' ``adapter_a`` / ``adapter_b`` added to the logits).
Such a parameter is bound as it is; when several active adapters set the same one, the one
activated last wins (the reference's order). Without an active adapter such an input keeps the
graph's initializer (or, with none, must be fed otherwise, as in the reference).
"""

from __future__ import annotations

import difflib
import logging
import os
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from genai.errors import GenaiError, check_type

if TYPE_CHECKING:
    from genai.generation.generator import Generator
    from genai.runtime.model import AdapterInput, LoraInput, Model

log = logging.getLogger(__name__)

__all__ = [
    "AdapterError",
    "AdapterInUseError",
    "Adapters",
    "read_adapter_file",
    "write_adapter_file",
]


class AdapterError(GenaiError, ValueError, RuntimeError):
    """An adapter file, name or parameter does not fit the model, or an adapter name is
    unknown / already taken. Also a RuntimeError: what onnxruntime-genai raises for these."""


class AdapterInUseError(GenaiError, RuntimeError):
    """`Adapters.unload` was asked to drop an adapter that a live generator has active."""


def read_adapter_file(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """The parameters of the onnxruntime adapter file ``path`` as ``{name: array}`` (copies,
    C-contiguous). FileNotFoundError when it does not exist, AdapterError when onnxruntime
    cannot read it."""
    import onnxruntime as ort  # lazy: onnxruntime's Python package loads only for adapter files

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"adapter file {str(path)!r} does not exist")
    try:
        values = ort.AdapterFormat.read_adapter(os.fspath(path)).get_parameters()
        return {
            name: np.array(value.numpy(), order="C", copy=True) for name, value in values.items()
        }
    except Exception as exc:  # onnxruntime's own error types
        raise AdapterError(
            f"{str(path)!r} is not a readable onnxruntime adapter file: {exc}"
        ) from exc


def write_adapter_file(
    path: str | os.PathLike[str],
    params: Mapping[str, np.ndarray],
    *,
    adapter_version: int = 1,
    model_version: int = 1,
) -> None:
    """Write ``params`` (``{name: array}``) as an onnxruntime ``.onnx_adapter`` file."""
    import onnxruntime as ort  # lazy: onnxruntime's Python package loads only for adapter files

    if not params:
        raise AdapterError("an adapter needs at least one parameter")
    adapter = ort.AdapterFormat()
    adapter.set_adapter_version(adapter_version)
    adapter.set_model_version(model_version)
    adapter.set_parameters(
        {
            name: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array))
            for name, array in params.items()
        }
    )
    adapter.export_adapter(os.fspath(path))


@dataclass(eq=False)
class _Adapter:
    name: str
    path: Path
    params: dict[str, np.ndarray]
    #: Live generators that have this adapter active.
    users: weakref.WeakSet[Generator] = field(default_factory=weakref.WeakSet)


# Adapters active on each live generator, in activation order (across `Adapters` containers).
_ACTIVE: weakref.WeakKeyDictionary[Generator, list[_Adapter]] = weakref.WeakKeyDictionary()


class Adapters:
    """LoRA adapters loaded for one model (onnxruntime-genai's ``og.Adapters``).

    ``load(path, name)`` reads an onnxruntime ``.onnx_adapter`` file and checks each parameter
    against the model's LoRA inputs; ``generator.set_active_adapter(adapters, name)`` activates
    it for one generator; ``unload(name)`` drops it once no live generator uses it.
    """

    def __init__(self, model: Model) -> None:
        from genai.runtime.model import Model  # lazy: the builder imports this module

        self.model = check_type(model, Model, "Adapters: model")
        self._adapters: dict[str, _Adapter] = {}

    @property
    def names(self) -> list[str]:
        """Names of the loaded adapters, in load order."""
        return list(self._adapters)

    def __contains__(self, name: object) -> bool:
        return name in self._adapters

    def __len__(self) -> int:
        return len(self._adapters)

    def load(self, path: str | os.PathLike[str], name: str) -> None:
        """Load the adapter file ``path`` under ``name``.

        Raises FileNotFoundError for a missing file and AdapterError when ``name`` is taken, the
        model has no LoRA inputs, or a parameter's name, dtype or shape does not fit the model
        (the message names the file and the parameter).
        """
        if not isinstance(name, str) or not name:
            raise AdapterError(f"an adapter name must be a non-empty string, got {name!r}")
        if name in self._adapters:
            raise AdapterError(
                f"an adapter named {name!r} is already loaded (from {self._adapters[name].path})"
            )
        path = Path(path)
        lora = self.model.lora_inputs
        others = self.model.adapter_inputs
        if not lora and not others:
            raise AdapterError(
                f"cannot load {str(path)!r}: the model {self.model.path} has no LoRA inputs "
                "(graph inputs named ...lora_A... / ...lora_B...) nor other inputs an adapter "
                "could set (graph inputs beyond ids, mask, positions and KV)"
            )
        params = read_adapter_file(path)
        _check_params(path, params, lora, others)
        self._adapters[name] = _Adapter(name, path, params)
        log.info("adapter %r loaded from %s (%d parameters)", name, path, len(params))

    def unload(self, name: str) -> None:
        """Drop the adapter ``name``. AdapterError when no adapter has that name;
        AdapterInUseError while a live generator has it active (delete those generators
        first)."""
        adapter = self._get(name)
        users = len(adapter.users)
        if users:
            raise AdapterInUseError(
                f"adapter {name!r} is active on {users} live generator{'s' if users > 1 else ''}; "
                "delete them before unloading it"
            )
        del self._adapters[name]

    def _get(self, name: str) -> _Adapter:
        try:
            return self._adapters[name]
        except (KeyError, TypeError):
            loaded = ", ".join(repr(n) for n in self._adapters) or "none"
            raise AdapterError(f"no adapter named {name!r} is loaded (loaded: {loaded})") from None

    def _activate(self, generator: Generator, name: str) -> None:
        """Activate ``name`` on ``generator`` (called by ``Generator.set_active_adapter``)."""
        adapter = self._get(name)
        if generator.model is not self.model:
            raise AdapterError(
                f"adapter {name!r} was loaded for model {self.model.path}, but the generator "
                f"runs model {generator.model.path}; load it with Adapters(generator.model)"
            )
        active = _ACTIVE.setdefault(generator, [])
        if adapter in active:
            return  # as in onnxruntime-genai: activating it again changes nothing
        active.append(adapter)
        try:
            _bind(generator, active)
        except BaseException:
            active.pop()
            raise
        adapter.users.add(generator)
        generator.active_adapters.append(name)

    def __repr__(self) -> str:
        return f"Adapters({str(self.model.path)!r}, loaded={self.names})"


def _check_params(
    path: Path,
    params: dict[str, np.ndarray],
    lora: Mapping[str, LoraInput],
    others: Mapping[str, AdapterInput],
) -> None:
    where = f"adapter {str(path)!r}"
    if not params:
        raise AdapterError(f"{where} has no parameters")
    for pname, array in params.items():
        other = others.get(pname)
        if other is not None:
            _check_plain_param(where, pname, array, other)
            continue
        spec = lora.get(pname)
        if spec is None:
            known = [*lora, *others]
            close = difflib.get_close_matches(pname, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; e.g. {known[0]!r}"
            raise AdapterError(
                f"{where}: parameter {pname!r} is not an input of the model an adapter can set "
                f"({len(lora)} LoRA inputs, {len(others)} other inputs{hint})"
            )
        if array.dtype != spec.dtype:
            raise AdapterError(
                f"{where}: parameter {pname!r} is {array.dtype}, the model's input is {spec.dtype}"
            )
        expected = list(spec.shape)
        expected[spec.rank_axis] = "rank"
        shape_ok = array.ndim == len(spec.shape) and all(
            int(array.shape[k]) == d for k, d in enumerate(spec.shape) if k != spec.rank_axis
        )
        if not shape_ok:
            raise AdapterError(
                f"{where}: parameter {pname!r} has shape {list(array.shape)}, the model expects "
                f"{expected}"
            )
        if spec.max_rank is not None and array.shape[spec.rank_axis] > spec.max_rank:
            raise AdapterError(
                f"{where}: parameter {pname!r} has rank {array.shape[spec.rank_axis]}, the "
                f"model's input has a fixed rank of {spec.max_rank}"
            )
    for pname in params:
        if pname in others:
            continue
        spec = lora[pname]
        if spec.partner not in params:
            raise AdapterError(
                f"{where}: parameter {pname!r} has no partner {spec.partner!r} (LoRA parameters "
                "come in A/B pairs)"
            )
        if spec.kind != "A":
            continue
        rank_a = params[pname].shape[spec.rank_axis]
        rank_b = params[spec.partner].shape[lora[spec.partner].rank_axis]
        if rank_a != rank_b:
            raise AdapterError(
                f"{where}: parameter {pname!r} has rank {rank_a} but {spec.partner!r} has rank "
                f"{rank_b}"
            )


def _check_plain_param(where: str, pname: str, array: np.ndarray, spec: AdapterInput) -> None:
    """A parameter bound as it is: the input's dtype, its rank and its fixed dimensions."""
    if spec.dtype is not None and array.dtype != spec.dtype:
        raise AdapterError(
            f"{where}: parameter {pname!r} is {array.dtype}, the model's input is {spec.dtype}"
        )
    fits = array.ndim == len(spec.shape) and all(
        not isinstance(d, int) or d < 0 or int(array.shape[k]) == d
        for k, d in enumerate(spec.shape)
    )
    if not fits:
        raise AdapterError(
            f"{where}: parameter {pname!r} has shape {list(array.shape)}, the model's input "
            f"has shape {list(spec.shape)}"
        )


def _bind(generator: Generator, active: list[_Adapter]) -> None:
    """Bind, on ``generator``'s binding, every LoRA input to the concatenation of the active
    adapters' arrays along the rank axis (the base value where no active adapter has one)."""
    model = generator.model
    values = {}
    for name, spec in model.lora_inputs.items():
        parts = [a.params[name] for a in active if name in a.params]
        if not parts:
            values[name] = spec.base
            continue
        value = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=spec.rank_axis)
        rank = value.shape[spec.rank_axis]
        if spec.max_rank is not None and rank != spec.max_rank:
            if rank > spec.max_rank:
                raise AdapterError(
                    f"the active adapters' ranks add up to {rank} for {name!r}, more than the "
                    f"model's fixed rank {spec.max_rank}"
                )
            pad = [(0, 0)] * value.ndim
            pad[spec.rank_axis] = (0, spec.max_rank - rank)
            value = np.pad(value, pad)  # zero rows/columns add exact zeros
        values[name] = value
    for name in model.adapter_inputs:
        # As ORT binds active adapters' parameters: the adapter activated last wins.
        chosen = [a.params[name] for a in active if name in a.params]
        if chosen:
            values[name] = chosen[-1]
    session = generator._session
    for name, value in values.items():
        # The binding keeps a reference to the array until the input is bound again.
        session.bind_input(name, value)
