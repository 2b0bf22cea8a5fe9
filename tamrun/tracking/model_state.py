"""A fitted model as data, never code: its tensors in a safetensors file, everything else in JSON.

A pickle runs whatever its bytes name when it is loaded: whoever can write to an artifact store could
run code in every process that loads a model from it. `save_state` writes a `tamrun.fit.fitted.FittedModel`
as two files that only hold data, and `load_state` rebuilds it without unpickling anything:

    fitted.safetensors   every tensor (and numeric numpy array) of the model, named t0, t1, ...,
                         on the host (it loads on a machine without a GPU)
    fitted.json          the object tree: {"format": FORMAT, "root": <node>}, where a node is
                         a JSON scalar | [node, ...] | {"str": node} (a dict of string keys) or
                         {"$": kind, ...}: tensor (its name, dtype, shape, finite), array (a tensor read back as numpy),
                         tuple, dict (pairs of nodes), set, float (nan, inf), timestamp (ISO),
                         dtype (torch's name), enum (class, value), object (class, fields), ref (an
                         object already read: shared objects stay shared)

An ``object`` or ``enum`` node names its class; `load_state` builds only tamrun's own classes
(``tamrun.`` modules, `ALLOWED_PREFIX`), without calling their ``__init__`` or ``__setstate__`` (the fields
are set as they were saved), so a tampered file cannot run code. A tensor or array node declares the
tensor's dtype, shape and whether it was finite; a tensor that is not what its node declares (int8 for
float64, another shape, a NaN or an infinity in a finite one) is refused naming it. A node of any other
kind is refused (`ModelStateError`). A logged model's files are also checked, before this reads them,
against the digests its run recorded in the tracking store (`tamrun.tracking.pyfunc_loader`): a file
changed by hand is refused whole.
"""

from __future__ import annotations

import enum
import importlib
import json
import math
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pandas as pd
import torch
from safetensors.torch import load_file, save_file

FORMAT = "tamrun-model-state/1"
TENSORS = "fitted.safetensors"
STATE = "fitted.json"
ALLOWED_PREFIX = "tamrun."
KIND = "$"
# Modules that moved to another package (old dotted name -> new): a state saved before the move names a
# class by its old module, and loads as the same class (`_allowed_class`).
MOVED_MODULES = {
    "tamrun.collector": "tamrun.process.collector", "tamrun.data.expr": "tamrun.config.expr",
    "tamrun.device": "tamrun.device.manager", "tamrun.effects.partial": "tamrun.fit.partial",
    "tamrun.evaluate": "tamrun.fit.evaluate", "tamrun.filesystem": "tamrun.process.filesystem",
    "tamrun.fitted": "tamrun.fit.fitted", "tamrun.forked_workers": "tamrun.sweeps.forked_workers",
    "tamrun.hydra_files": "tamrun.process.hydra_files", "tamrun.intervals": "tamrun.fit.intervals",
    "tamrun.joblog": "tamrun.process.joblog", "tamrun.memory.gpu": "tamrun.machine.gpu",
    "tamrun.memory.host": "tamrun.machine.host", "tamrun.memory.limits": "tamrun.machine.limits",
    "tamrun.memory.profiler": "tamrun.device.profiler", "tamrun.memory.report": "tamrun.device.memory_report",
    "tamrun.memory.sampling": "tamrun.machine.sampling", "tamrun.memory.tracker": "tamrun.machine.tracker",
    "tamrun.memory.units": "tamrun.config.units", "tamrun.outcome": "tamrun.process.outcome",
    "tamrun.placement": "tamrun.machine.placement", "tamrun.progress": "tamrun.fit.progress",
    "tamrun.ray_env": "tamrun.cluster.env", "tamrun.ray_jobs": "tamrun.sweeps.ray_launch",
    "tamrun.ray_resources": "tamrun.cluster.resources", "tamrun.ray_start": "tamrun.cluster.start",
    "tamrun.run_folder": "tamrun.process.run_folder", "tamrun.solve.dispatcher": "tamrun.fit.dispatcher",
    "tamrun.solve.gcv": "tamrun.fit.gcv", "tamrun.threads": "tamrun.machine.threads",
    "tamrun.tracking.datasets": "tamrun.tracking.artifacts.datasets",
    "tamrun.tracking.held": "tamrun.tracking.sweep_record.held",
    "tamrun.tracking.held_spool": "tamrun.tracking.sweep_record.held_spool",
    "tamrun.tracking.lost_jobs": "tamrun.sweeps.lost_jobs",
    "tamrun.tracking.plots": "tamrun.tracking.artifacts.plots",
    "tamrun.tracking.run_plots": "tamrun.tracking.artifacts.run_plots",
    "tamrun.tracking.secrets": "tamrun.tracking.store.secrets",
    "tamrun.tracking.server_access": "tamrun.tracking.store.server_access",
    "tamrun.tracking.store": "tamrun.tracking.store.store",
    "tamrun.tracking.store_wait": "tamrun.tracking.store.store_wait", "tamrun.tracking.sweep": "tamrun.sweeps.sweep",
    "tamrun.tracking.sweep_end": "tamrun.sweeps.sweep_end",
    "tamrun.tracking.sweep_failures": "tamrun.sweeps.sweep_failures",
    "tamrun.tracking.sweep_files": "tamrun.tracking.sweep_record.sweep_files",
    "tamrun.tracking.sweep_names": "tamrun.tracking.sweep_record.sweep_names",
    "tamrun.tracking.sweep_summary": "tamrun.tracking.sweep_record.sweep_summary",
    "tamrun.tracking.tables": "tamrun.tracking.artifacts.tables",
}


class ModelStateError(ValueError):
    """A model state file that is not one `save_state` wrote (a kind, class or format it does not know)."""


class _Writer:
    """The JSON tree of an object, its tensors gathered apart (module doc)."""

    def __init__(self) -> None:
        self.tensors: Dict[str, torch.Tensor] = {}
        self.seen: Dict[int, int] = {}  # id(object) -> its number, for refs
        self.kept: List[Any] = []  # the objects numbered, alive until the end (ids stay unique)

    def node(self, value: Any) -> Any:
        if value is None or isinstance(value, (bool, str)) or (isinstance(value, int) and not isinstance(value, enum.Enum)):
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else {KIND: "float", "value": repr(value)}
        if isinstance(value, np.generic):
            return self.node(value.item())
        if isinstance(value, torch.dtype):
            return {KIND: "dtype", "name": str(value).removeprefix("torch.")}
        if isinstance(value, pd.Timestamp):
            return {KIND: "timestamp", "iso": value.isoformat(), "tz": str(value.tz) if value.tz else None}
        if isinstance(value, enum.Enum):
            return {KIND: "enum", "class": _class_name(type(value)), "value": self.node(value.value)}
        if isinstance(value, torch.Tensor):
            return {KIND: "tensor", **self._tensor(value)}
        if isinstance(value, np.ndarray):
            if value.dtype.kind in "biuf":
                return {KIND: "array", **self._tensor(torch.from_numpy(np.ascontiguousarray(value)))}
            return {KIND: "list_array", "items": [self.node(v) for v in value.tolist()], "dtype": value.dtype.str}
        if isinstance(value, list):
            return [self.node(v) for v in value]
        if isinstance(value, tuple):
            return {KIND: "tuple", "items": [self.node(v) for v in value]}
        if isinstance(value, (set, frozenset)):
            return {KIND: "set", "items": [self.node(v) for v in sorted(value, key=repr)]}
        if isinstance(value, dict):
            if all(isinstance(k, str) and k != KIND for k in value):
                return {k: self.node(v) for k, v in value.items()}
            return {KIND: "dict", "pairs": [[self.node(k), self.node(v)] for k, v in value.items()]}
        return self._object(value)

    def _tensor(self, tensor: torch.Tensor) -> Dict[str, Any]:
        """The tensor kept under a new name; its node's fields: the name and what `_checked` expects of it."""
        name = f"t{len(self.tensors)}"
        self.tensors[name] = tensor.detach().cpu().contiguous().clone()
        return {"name": name, "dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape),
                "finite": _finite(self.tensors[name])}

    def _object(self, value: Any) -> Any:
        if id(value) in self.seen:
            return {KIND: "ref", "id": self.seen[id(value)]}
        cls = type(value)
        if not cls.__module__.startswith(ALLOWED_PREFIX) or not hasattr(value, "__dict__"):
            raise ModelStateError(f"cannot store a {cls.__module__}.{cls.__qualname__} in a model state "
                                  "(only tamrun's classes, tensors, arrays and plain data)")
        number = len(self.kept)
        self.seen[id(value)] = number
        self.kept.append(value)
        return {KIND: "object", "class": _class_name(cls), "id": number,
                "fields": {name: self.node(field) for name, field in vars(value).items()}}


def _class_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _allowed_class(name: str) -> type:
    """The tamrun class ``module:qualname`` names; anything else is a `ModelStateError`."""
    module, _, qualname = name.partition(":")
    if not module.startswith(ALLOWED_PREFIX) or not qualname or any(not part.isidentifier() for part in
                                                                   [*module.split("."), *qualname.split(".")]):
        raise ModelStateError(f"the class {name!r} is not one of tamrun's")
    found: Any = importlib.import_module(MOVED_MODULES.get(module, module))
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if not isinstance(found, type) or not found.__module__.startswith(ALLOWED_PREFIX):
        raise ModelStateError(f"the class {name!r} is not one of tamrun's")
    return found


class _Reader:
    """The object a JSON tree describes, its tensors read from the safetensors file (module doc)."""

    def __init__(self, tensors: Dict[str, torch.Tensor]) -> None:
        self.tensors = tensors
        self.objects: Dict[int, Any] = {}

    def value(self, node: Any) -> Any:
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if isinstance(node, list):
            return [self.value(v) for v in node]
        if not isinstance(node, dict):
            raise ModelStateError(f"not a model state node: {type(node).__name__}")
        if KIND not in node:
            return {k: self.value(v) for k, v in node.items()}
        kind = node[KIND]
        readers = {"float": lambda: float(node["value"]), "dtype": lambda: _dtype(node["name"]),
                   "timestamp": lambda: pd.Timestamp(node["iso"]),
                   "enum": lambda: _allowed_class(node["class"])(self.value(node["value"])),
                   "tensor": lambda: self._tensor(node),
                   "array": lambda: self._tensor(node).numpy(),
                   "list_array": lambda: np.array([self.value(v) for v in node["items"]], dtype=np.dtype(node["dtype"])
                                                  if np.dtype(node["dtype"]).kind != "O" else object),
                   "tuple": lambda: tuple(self.value(v) for v in node["items"]),
                   "set": lambda: {self.value(v) for v in node["items"]},
                   "dict": lambda: {self.value(k): self.value(v) for k, v in node["pairs"]},
                   "ref": lambda: self.objects[int(node["id"])], "object": lambda: self._object(node)}
        if kind not in readers:
            raise ModelStateError(f"unknown node kind {kind!r}")
        return readers[kind]()

    def _tensor(self, node: Dict[str, Any]) -> torch.Tensor:
        name = node["name"]
        if name not in self.tensors:
            raise ModelStateError(f"no tensor {name!r} in {TENSORS}")
        return _checked(name, self.tensors[name], node)

    def _object(self, node: Dict[str, Any]) -> Any:
        cls = _allowed_class(node["class"])
        made = object.__new__(cls)  # no __init__, no __setstate__: the fields as they were saved
        self.objects[int(node["id"])] = made
        fields = {str(k): v for k, v in node["fields"].items()}
        if any(name.startswith("__") for name in fields):
            raise ModelStateError(f"a field of {node['class']} names a special attribute")
        made.__dict__.update({name: self.value(v) for name, v in fields.items()})
        return made


def _finite(tensor: torch.Tensor) -> bool:
    """Whether every value of ``tensor`` is finite (a tensor of integers or booleans always is)."""
    return not (tensor.is_floating_point() or tensor.is_complex()) or bool(torch.isfinite(tensor).all())


def _checked(name: str, tensor: torch.Tensor, node: Dict[str, Any]) -> torch.Tensor:
    """``tensor`` when it is what its node declares: its dtype and shape (a state of an older tamrun declares
    neither), and finite unless the node says it was saved with non-finite values; else a `ModelStateError`."""
    problem = None
    if "dtype" in node and str(tensor.dtype).removeprefix("torch.") != node["dtype"]:
        problem = f"is {str(tensor.dtype).removeprefix('torch.')}, where {STATE} declares {node['dtype']}"
    elif "shape" in node and list(tensor.shape) != list(node["shape"]):
        problem = f"has the shape {list(tensor.shape)}, where {STATE} declares {list(node['shape'])}"
    elif node.get("finite", True) and not _finite(tensor):
        bad = int((~torch.isfinite(tensor)).sum())
        problem = f"holds {bad} non-finite value(s) (NaN or infinite), where {STATE} declares it finite"
    if problem:
        raise ModelStateError(f"the tensor {name!r} of {TENSORS} {problem}: the model is refused (log it again)")
    return tensor


def _dtype(name: str) -> torch.dtype:
    found = getattr(torch, name, None)
    if not isinstance(found, torch.dtype):
        raise ModelStateError(f"not a torch dtype: {name!r}")
    return found


def save_state(model: Any, folder: Path) -> List[Path]:
    """Write ``model`` (a FittedModel on the host) as ``folder/fitted.safetensors`` and ``folder/fitted.json``;
    returns both paths."""
    writer = _Writer()
    tree = {"format": FORMAT, "root": writer.node(model)}
    folder.mkdir(parents=True, exist_ok=True)
    save_file(writer.tensors, str(folder / TENSORS))
    (folder / STATE).write_text(json.dumps(tree), encoding="utf-8")
    return [folder / TENSORS, folder / STATE]


def load_state(folder: Path) -> Any:
    """The model `save_state` wrote in ``folder``, on the CPU, without unpickling (module doc). A model
    logged as a pickle (``fitted.pkl``, by tamrun before this format) is refused, not unpickled."""
    if not Path(folder).is_dir():
        raise ModelStateError(f"{folder} is not a tamrun model state folder (a model logged as a pickle by an "
                              "older tamrun is not loaded: pickles run code; log the model again)")
    tree = json.loads((Path(folder) / STATE).read_text(encoding="utf-8"))
    if not isinstance(tree, dict) or tree.get("format") != FORMAT:
        raise ModelStateError(f"{Path(folder) / STATE} is not a {FORMAT} file")
    try:
        return _Reader(load_file(str(Path(folder) / TENSORS), device="cpu")).value(tree["root"])
    except (KeyError, TypeError, AttributeError, IndexError) as exc:  # a tree `save_state` did not write
        raise ModelStateError(f"{Path(folder) / STATE} is not a model state tamrun wrote ({type(exc).__name__}: "
                              f"{exc})") from None
