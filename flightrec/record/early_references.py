"""torch.distributed functions a library keeps a reference to, taken before the recorder armed.

Wrapping `torch.distributed.X` reaches every caller that looks X up when it calls. DeepSpeed's
TorchBackend (deepspeed/comm/torch.py, the backend of `deepspeed.comm`) does not for two of them: its
constructor keeps `all_gather_into_tensor` and `reduce_scatter_tensor` (`_all_gather_base` and
`_reduce_scatter_base` on older torch) as the attributes `all_gather_function` and
`reduce_scatter_function`, and only then calls init_process_group, which is where FLIGHTREC=1 arms the
recorder (_autostart.py). ZeRO's parameter all-gathers and gradient reduce-scatters go through those
attributes: unwrapped, they are recorded on torch 2.13 under the inner `all_gather_single` /
`reduce_scatter_single` with a call site inside torch, and on releases where they call the backend
themselves (2.4) only as C++-issued ops, without op name or shapes.

So at arming, those attributes are pointed at the wrappers wherever they hold a function the recorder
just wrapped: on the backend being constructed (found on the calling stack, since `deepspeed.comm.cdb`
is assigned only once its constructor returns) and on `deepspeed.comm.comm.cdb` when it exists (armed
by `flightrec.enable()` after DeepSpeed initialised). Disarming puts back what was there, where our
wrapper is still in place. Nothing here imports DeepSpeed: only a module already loaded is looked at.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

# (module whose code holds the object, attributes that hold a torch.distributed function)
HOLDERS = (("deepspeed.comm.torch", ("all_gather_function", "reduce_scatter_function")),)
GLOBALS = (("deepspeed.comm.comm", "cdb"),)  # module-level objects of the same kind
MAX_FRAMES = 64  # the stack from init_process_group's hook up to the backend's constructor is ~10 frames


def _holders() -> list[Any]:
    """Backend objects of a known holder: being constructed on this thread's stack, or already global."""
    found: list[Any] = []
    modules = {name for name, _ in HOLDERS}
    frame = sys._getframe(1)
    for _ in range(MAX_FRAMES):
        if frame is None:
            break
        if frame.f_globals.get("__name__") in modules:
            candidate = frame.f_locals.get("self")
            if candidate is not None and all(candidate is not f for f in found):
                found.append(candidate)
        frame = frame.f_back
    for module_name, name in GLOBALS:
        module = sys.modules.get(module_name)
        candidate = getattr(module, name, None) if module is not None else None
        if candidate is not None and all(candidate is not f for f in found):
            found.append(candidate)
    return found


def rebind(wrapper_of: Callable[[Any], Any | None]) -> list[tuple[Any, str, Any, Any]]:
    """Point each known attribute that holds a wrapped original at its wrapper (`wrapper_of(original)`,
    None: not ours). Returns (object, attribute, original, wrapper) for `restore`."""
    names = tuple(attr for _, attrs in HOLDERS for attr in attrs)
    changed: list[tuple[Any, str, Any, Any]] = []
    for holder in _holders():
        for attr in names:
            original = getattr(holder, attr, None)
            wrapper = wrapper_of(original) if callable(original) else None
            if wrapper is not None:
                setattr(holder, attr, wrapper)
                changed.append((holder, attr, original, wrapper))
    return changed


def restore(changed: list[tuple[Any, str, Any, Any]]) -> None:
    for holder, attr, original, wrapper in reversed(changed):
        if getattr(holder, attr, None) is wrapper:
            setattr(holder, attr, original)
    changed.clear()
