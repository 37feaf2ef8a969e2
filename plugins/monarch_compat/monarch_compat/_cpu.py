"""A test aid, not a feature: run a program written for GPUs on CPU only,
with the smallest substitution -- CUDA devices become the CPU, NCCL becomes
gloo -- so that the reference's CUDA examples can be checked on a machine
without GPUs.  Opt in with ``MONARCH_COMPAT_CPU=1`` (or run the program with
``python -m monarch_compat.cpu program.py``, which also reaches processes that
never import ``monarch``, such as torchrun's ranks).  See docs/compat.md.

Contract of :func:`install` (idempotent; a no-op unless :func:`enabled`):

* a device argument that names CUDA (``"cuda"``, ``"cuda:1"``,
  ``torch.device("cuda", 0)``) given to ``Tensor.to``, ``Module.to``, the
  tensor factories (``torch.rand(..., device=...)`` and the others of
  :data:`_FACTORIES`) or ``torch.set_default_device`` is the CPU instead;
  ``torch.set_default_device`` of the CPU while the default already is the
  CPU does nothing (so a tensor engine's refusal of a default device change
  inside ``mesh.activate()`` is not reached);
* ``Tensor.cuda()`` / ``Module.cuda()`` return ``.to("cpu")``;
* ``torch.cuda.set_device``, ``synchronize``, ``empty_cache``,
  ``manual_seed``/``manual_seed_all`` do nothing;
* ``torch.distributed.init_process_group``/``new_group`` with backend
  ``"nccl"`` use ``"gloo"``;
* a tensor made for CUDA by ``rand``/``randn``/``zeros``/``ones``/``empty``/
  ``full`` larger than ``MONARCH_COMPAT_CPU_TENSOR_MB`` (default 1024) fails,
  as on a GPU too small for it (on CPU every proc would allocate it and the
  OOM killer would end them): ``torch.OutOfMemoryError`` where it is made
  locally; inside ``mesh.activate()`` its device stays CUDA, so the client
  gets its handle and the procs fail to make it (a failure the program sees
  when it uses the tensor, as with a GPU's out-of-memory error).

``torch.cuda.is_available()`` still answers the truth (False on a CPU
machine): programs that choose their path by it keep choosing.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

logger = logging.getLogger("monarch.compat")

#: the environment variable that turns the substitution on (any of 1/true/yes/on)
ENV = "MONARCH_COMPAT_CPU"

#: torch's tensor factories whose ``device=`` keyword is mapped
_FACTORIES = ("rand", "randn", "randint", "randperm", "zeros", "ones", "empty", "full", "tensor", "as_tensor",
              "arange", "linspace", "logspace", "eye", "zeros_like", "ones_like", "empty_like", "full_like",
              "rand_like", "randn_like", "randint_like", "empty_strided", "scalar_tensor", "normal")

_installed = False


def enabled() -> bool:
    """Whether ``MONARCH_COMPAT_CPU`` asks for the substitution."""
    from monarch_compat import _settings

    return bool(_settings.get(ENV))


def _is_cuda(device: Any) -> bool:
    import torch

    if isinstance(device, str):
        return device.split(":", 1)[0].strip() == "cuda"
    return isinstance(device, torch.device) and device.type == "cuda"


def _cpu(device: Any) -> Any:
    """``device``, with a CUDA device replaced by the CPU."""
    return "cpu" if _is_cuda(device) else device


def _map_args(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A ``.to(...)`` call's arguments with a CUDA device (first positional or
    ``device=``) replaced by the CPU."""
    if args and _is_cuda(args[0]):
        args = ("cpu", *args[1:])
    if "device" in kwargs and _is_cuda(kwargs["device"]):
        kwargs = {**kwargs, "device": "cpu"}
    return args, kwargs


#: the most bytes one tensor made for a CUDA device may take (``MONARCH_COMPAT_CPU_TENSOR_MB``, default 1024)
def _limit() -> int:
    from monarch_compat import _settings

    return int(_settings.get("MONARCH_COMPAT_CPU_TENSOR_MB") * (1 << 20))


def _engine_active() -> bool:
    """Whether a tensor engine mesh is active in this thread (its procs make the tensors)."""
    try:
        from monarch_tensor_engine import api
    except ImportError:
        return False
    return api.get_active_mesh() is not None


def _too_big(name: str, args: tuple, kwargs: dict) -> bool:
    import torch

    try:
        _check_size(name, args, kwargs)
    except torch.OutOfMemoryError:
        return True
    return False


def _check_size(name: str, args: tuple, kwargs: dict) -> None:
    """Raise ``torch.OutOfMemoryError``, as a GPU would, for a tensor of
    ``rand``/``randn``/``zeros``/``ones``/``empty``/``full`` made for CUDA that
    is larger than :func:`_limit`: on CPU it would be allocated for real in
    every proc and the kernel's OOM killer, not an exception, would end them
    (programs that probe a GPU's memory catch the exception)."""
    import torch

    if name not in ("rand", "randn", "zeros", "ones", "empty", "full"):
        return
    size = args[0] if args and isinstance(args[0], (tuple, list, torch.Size)) else args
    if not isinstance(size, (tuple, list, torch.Size)) or not all(isinstance(d, int) for d in size):
        return
    numel = 1
    for d in size:
        numel *= d
    dtype = kwargs.get("dtype") or torch.get_default_dtype()
    nbytes = numel * torch.empty((), dtype=dtype, device="meta").element_size()
    if nbytes > _limit():
        raise torch.OutOfMemoryError(
            f"monarch-compat CPU substitution ({ENV}): a {nbytes / (1 << 30):.1f} GiB tensor made for CUDA is over "
            f"MONARCH_COMPAT_CPU_TENSOR_MB ({_limit() >> 20} MiB), which stands for the GPU's memory")


def _wrap(owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    original = getattr(owner, name, None)
    if original is None or getattr(original, "_monarch_compat_cpu", False):
        return
    wrapped = make(original)
    functools.update_wrapper(wrapped, original)
    wrapped._monarch_compat_cpu = True  # type: ignore[attr-defined]
    setattr(owner, name, wrapped)


def install() -> None:
    """Install the substitution in this process when :func:`enabled` (see the
    module docstring); idempotent."""
    global _installed
    if _installed or not enabled():
        return
    _installed = True
    import torch
    import torch.distributed as dist

    try:  # the tensor engine wraps set_default_device itself (when its api is loaded): ours goes outside its wrapper
        import monarch_tensor_engine.api  # noqa: F401
    except ImportError:
        pass

    def to_method(original: Callable[..., Any]) -> Callable[..., Any]:
        def to(self: Any, *args: Any, **kwargs: Any) -> Any:
            args, kwargs = _map_args(args, kwargs)
            return original(self, *args, **kwargs)
        return to

    def cuda_method(original: Callable[..., Any]) -> Callable[..., Any]:
        def cuda(self: Any, device: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
            return self.to("cpu")
        return cuda

    def factory(original: Callable[..., Any]) -> Callable[..., Any]:
        name = original.__name__

        def make(*args: Any, **kwargs: Any) -> Any:
            if "device" in kwargs and _is_cuda(kwargs["device"]):
                if _too_big(name, args, kwargs) and _engine_active():
                    # the procs make it: left on CUDA, making it fails there, as on a GPU too small for it
                    return original(*args, **kwargs)
                _check_size(name, args, kwargs)
                kwargs["device"] = "cpu"
            return original(*args, **kwargs)
        return make

    def set_default_device(original: Callable[..., Any]) -> Callable[..., Any]:
        def set_default(device: Any) -> Any:
            device = _cpu(device)
            if device is not None and torch.device(device).type == "cpu" and torch.get_default_device().type == "cpu":
                return None
            return original(device)
        return set_default

    def nothing(original: Callable[..., Any]) -> Callable[..., Any]:
        def noop(*args: Any, **kwargs: Any) -> None:
            return None
        return noop

    def gloo(original: Callable[..., Any]) -> Callable[..., Any]:
        def with_gloo(*args: Any, **kwargs: Any) -> Any:
            if args and isinstance(args[0], str) and "nccl" in args[0]:
                args = (args[0].replace("nccl", "gloo"), *args[1:])
            if isinstance(kwargs.get("backend"), str) and "nccl" in kwargs["backend"]:
                kwargs["backend"] = kwargs["backend"].replace("nccl", "gloo")
            return original(*args, **kwargs)
        return with_gloo

    _wrap(torch.Tensor, "to", to_method)
    _wrap(torch.nn.Module, "to", to_method)
    _wrap(torch.Tensor, "cuda", cuda_method)
    _wrap(torch.nn.Module, "cuda", cuda_method)
    for name in _FACTORIES:
        _wrap(torch, name, factory)
    _wrap(torch, "set_default_device", set_default_device)
    for name in ("set_device", "synchronize", "empty_cache", "manual_seed", "manual_seed_all"):
        _wrap(torch.cuda, name, nothing)
    _wrap(dist, "init_process_group", gloo)
    _wrap(dist, "new_group", gloo)
    logger.info("monarch-compat: %s is set: CUDA devices are the CPU, nccl is gloo (a test aid)", ENV)
