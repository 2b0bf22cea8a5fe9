"""Where tensors live: the host and the compute device, one rule and one mover.

The rule (docs/architecture.md, "Placement"): the `tamrun.device.manager.DeviceManager` owns the compute device
(``devices.device``, always with an index: ``cuda:0``). Data is read, checked and batched on the host
(`HOST`); a tensor reaches the compute device only through ``.to(devices.device)`` or a factory given
that device (or another tensor's ``.device``); results come back with ``.cpu()``. A state made of many
tensors (a design, a fitted model) moves as a whole with `to_device`, never field by field.

`PlacementCheck` makes the rule checkable on a machine without a GPU (``hw=check``): the compute device
is the CPU under another name, ``cpu:0``; every tensor placed there is tagged, reports ``cpu:0`` as its
device, and an operation mixing tagged and host tensors fails as it would on a GPU.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Optional

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakTensorKeyDictionary

HOST = torch.device("cpu")
# The compute device under hw=check: the CPU, named with an index so that it differs from HOST.
CHECK_DEVICE = torch.device("cpu", 0)


class PlacementError(RuntimeError):
    """A tensor operation that would fail on a GPU: it mixes compute-device and host tensors, or reads a
    compute-device tensor as a host array (a bug of tamrun's, never the user's)."""


# ---- moving a whole state -------------------------------------------------------------------------

def _owned(value: Any) -> bool:
    """Objects whose fields `to_device` walks: tamrun's own classes (designs, effects, scalers, blocks)."""
    return type(value).__module__.startswith("tamrun.") and hasattr(value, "__dict__")


def to_device(state: Any, device: torch.device, memo: Optional[Dict[int, Any]] = None) -> Any:
    """``state`` with every tensor it holds on ``device``: tensors, lists, tuples, dicts and tamrun's own
    objects (dataclasses or not) are walked; objects are copied (their fields, without calling
    ``__init__`` or ``__getstate__``), never changed in place, and one object reached twice stays one
    (``memo``, as deepcopy's); a tensor already there is shared. Anything else (numpy arrays, strings,
    numbers, dtypes) is kept as it is."""
    memo = {} if memo is None else memo
    if id(state) in memo:
        return memo[id(state)]
    if isinstance(state, torch.Tensor):
        moved: Any = state.to(device)
    elif isinstance(state, list):
        moved = [to_device(item, device, memo) for item in state]
    elif isinstance(state, tuple):
        items = [to_device(item, device, memo) for item in state]
        moved = type(state)(*items) if hasattr(state, "_fields") else tuple(items)
    elif isinstance(state, dict):
        moved = {key: to_device(item, device, memo) for key, item in state.items()}
    elif _owned(state):
        moved = object.__new__(type(state))
        memo[id(state)] = moved
        moved.__dict__.update({key: to_device(item, device, memo) for key, item in vars(state).items()})
    else:
        return state
    memo[id(state)] = moved
    return moved


def tensors_in(state: Any, path: str = "") -> Iterator[tuple]:
    """(path, tensor) for every tensor `to_device` would move (tests and checks)."""
    if isinstance(state, torch.Tensor):
        yield path, state
    elif isinstance(state, (list, tuple)):
        for i, item in enumerate(state):
            yield from tensors_in(item, f"{path}[{i}]")
    elif isinstance(state, dict):
        for key, item in state.items():
            yield from tensors_in(item, f"{path}[{key!r}]")
    elif _owned(state):
        for key, item in vars(state).items():
            yield from tensors_in(item, f"{path}.{key}" if path else key)


# ---- checking the rule on the CPU -------------------------------------------------------------------

_DEVICE_PROPERTY = torch.Tensor.device.__get__
# Operations whose index arguments may stay on the host when the indexed tensor is on the device (CUDA
# accepts host index tensors there), and copy_, which copies across devices.
_INDEXING = ("__getitem__", "__setitem__", "index_select", "index_put_", "index_put")
_READS_TO_HOST = ("numpy", "__array__")


def _flat_tensors(values: Any) -> Iterator[torch.Tensor]:
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from _flat_tensors(value)


def _as_device(value: Any) -> Optional[torch.device]:
    if isinstance(value, torch.device):
        return value
    if isinstance(value, str):
        try:
            return torch.device(value)
        except RuntimeError:
            return None
    return None


class PlacementCheck(TorchFunctionMode):
    """A torch function mode that keeps the compute device (`CHECK_DEVICE`) apart from the host on a CPU.

    A tensor is on the compute device when an operation placed it there (``device=cpu:0``, ``.to(cpu:0)``)
    or computed it from one that is; ``t.device`` then reads ``cpu:0``, and ``.cpu()`` / ``.to(HOST)``
    make a host copy. It fails (`PlacementError`), as a GPU would, on an operation mixing both kinds of
    tensor (a host tensor of 0 dimensions excepted, and host indices into a device tensor), on
    ``.numpy()`` of a device tensor, and on a tensor placed on any other device than these two.
    """

    def __init__(self, device: torch.device = CHECK_DEVICE) -> None:
        super().__init__()
        self.device = device
        self._placed: WeakTensorKeyDictionary = WeakTensorKeyDictionary()

    def placed(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` is on the compute device."""
        return tensor in self._placed

    def _target(self, name: str, args: tuple, kwargs: Dict[str, Any]) -> Optional[bool]:
        """Where an operation puts its result when it says so: True (compute), False (host), None (it
        follows its inputs)."""
        target = kwargs.get("device")
        if name == "to":
            for arg in args[1:]:
                if isinstance(arg, torch.Tensor):
                    return self.placed(arg)
                target = _as_device(arg) or target
            if isinstance(kwargs.get("other"), torch.Tensor):
                return self.placed(kwargs["other"])
        elif name == "cpu":
            return False
        elif name == "cuda":
            target = torch.device("cuda")
        if target is None:
            return None
        device = _as_device(target)
        if device == self.device:
            return True
        if device == HOST:
            return False
        raise PlacementError(f"placement: {name} places a tensor on {device} under hw=check; use the device "
                             f"manager's device ({self.device}) or the host")

    def _check_mix(self, name: str, args: tuple, kwargs: Dict[str, Any]) -> bool:
        """Whether any input is on the compute device; `PlacementError` when host tensors are mixed in."""
        inputs = list(_flat_tensors(list(args) + list(kwargs.values())))
        if name in _INDEXING and inputs:
            indices = list(_flat_tensors(args[1:2]))  # host indices into a device tensor are allowed
            if self.placed(inputs[0]):
                inputs = [t for t in inputs if not any(t is i for i in indices) or self.placed(t)]
        on_device = [t for t in inputs if self.placed(t)]
        on_host = [t for t in inputs if not self.placed(t) and t.dim() > 0]
        if on_device and on_host and name != "copy_":
            raise PlacementError(
                f"placement: {name} mixes tensors on the compute device {[tuple(t.shape) for t in on_device]} "
                f"with host tensors {[tuple(t.shape) for t in on_host]}: on a GPU this fails with 'Expected all "
                "tensors to be on the same device'. Move the state with tamrun.machine.placement.to_device or the "
                "inputs with .to(devices.device) (docs/architecture.md, Placement)")
        if name == "copy_":
            return self.placed(args[0])
        return bool(on_device)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func == _DEVICE_PROPERTY:
            return self.device if self.placed(args[0]) else args[0].device
        name = getattr(func, "__name__", "")
        if name in _READS_TO_HOST and args and isinstance(args[0], torch.Tensor) and self.placed(args[0]):
            raise PlacementError(f"placement: .{name}() of a tensor on the compute device {tuple(args[0].shape)}: "
                                 "a GPU tensor must come to the host first (.cpu())")
        target = self._target(name, args, kwargs)
        from_device = self._check_mix(name, args, kwargs) if target is None else False
        with torch._C.DisableTorchFunction():
            out = func(*args, **kwargs)
        if target is not None and isinstance(out, torch.Tensor) and args and out is args[0] \
                and self.placed(out) != target:
            with torch._C.DisableTorchFunction():
                out = out.clone()  # a real move makes a new tensor
        if target if target is not None else from_device:
            for result in (out if isinstance(out, (list, tuple)) else (out,)):
                if isinstance(result, torch.Tensor):
                    self._placed[result] = True
        return out
