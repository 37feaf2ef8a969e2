"""Serialization of user payloads: cloudpickle, protocol 5, out-of-band buffers.

Large contiguous buffers travel as separate frames and are never copied into
the pickle string: ``bytearray``, NumPy arrays (anything exposing
``PickleBuffer``), and plain contiguous CPU ``torch.Tensor`` s
(whose default pickling goes through ``torch.save`` and copies twice).  On the
receiving side a tensor is rebuilt *on* the received buffer, without a copy.
Small buffers stay in-band, where they are cheaper.
"""

from __future__ import annotations

import ctypes
import io
import pickle
import sys
import types
from typing import Any

import cloudpickle

from monarch_core._proc import _construction

OOB_MIN = 16 * 1024
#: ``bytes`` at least this large travel out of band (plain payloads only).
BYTES_OOB_MIN = 256 * 1024
_BYTES_MARK = b"B"  # first byte of a payload pickled by _dumps_bytes_oob (a pickle starts with 0x80)


def _rebuild_tensor(buf: Any, dtype: Any, shape: tuple) -> Any:
    import torch

    mv = memoryview(buf)
    if mv.nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    if mv.readonly:  # in-band (bytes): torch wants a writable buffer
        buf = bytearray(mv)
    return torch.frombuffer(buf, dtype=torch.uint8).view(dtype).reshape(shape)


def _reduce_tensor(t: Any) -> Any:
    """Out-of-band reduction of a plain, contiguous CPU tensor (else None)."""
    try:
        if (
            t.device.type != "cpu"
            or t.requires_grad
            or t.layout is not _torch_strided()
            or t.is_quantized
            or not t.is_contiguous()
        ):
            return None
        nbytes = t.numel() * t.element_size()
    except Exception:  # noqa: BLE001 - anything unusual: torch's own pickling
        return None
    if nbytes < OOB_MIN:
        return None
    arr = (ctypes.c_char * nbytes).from_address(t.data_ptr())
    arr.keep = t  # the view must keep the tensor's memory alive until it is sent
    return (_rebuild_tensor, (pickle.PickleBuffer(arr), t.dtype, tuple(t.shape)))


def _torch_strided() -> Any:
    return sys.modules["torch"].strided


_cloudpickle_code_reduce = cloudpickle.Pickler.dispatch_table[types.CodeType]


def _reduce_code(code: types.CodeType) -> Any:
    """cloudpickle's reduction of a code object (of a function pickled by
    value: defined in ``__main__``, a notebook...), keeping its file name:
    cloudpickle writes ``<dynamic-code>`` there, and tracebacks and pdb
    (``monarch debug``) would then show no source."""
    rebuild, args = _cloudpickle_code_reduce(code)
    return (_code_in_file, (rebuild, args, code.co_filename))


def _code_in_file(rebuild: Any, args: tuple, filename: str) -> types.CodeType:
    return rebuild(*args).replace(co_filename=filename)  # type: ignore[no-any-return]


class _Pickler(cloudpickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        t = type(obj)
        if t is types.CodeType:
            return _reduce_code(obj)
        # torch.Tensor of a loaded torch (another thread may be importing it right now:
        # a half-initialized module has no Tensor yet, and no tensor can exist before it does)
        if t is getattr(sys.modules.get("torch"), "Tensor", None):
            r = _reduce_tensor(obj)
            if r is not None:
                return r
        return super().reducer_override(obj)


_ATOMS = frozenset({type(None), bool, int, float, str, bytes, complex})
_PLAIN_MAX = 64  # containers checked item by item up to this many items in all


def _plain(obj: Any) -> int:
    """Nonzero if ``obj`` is built only from builtin scalars, strings, bytes
    and exact tuples/lists/dicts of them (small): the C pickler then writes
    exactly what cloudpickle would, several times faster.  2: it holds a
    ``bytes`` of at least ``BYTES_OOB_MIN``."""
    budget = _PLAIN_MAX
    stack = [obj]
    atoms = _ATOMS
    big = 1
    while stack:
        o = stack.pop()
        t = type(o)
        if t in atoms:
            if t is bytes and len(o) >= BYTES_OOB_MIN:
                big = 2
            continue
        budget -= 1
        if budget < 0:
            return False
        if t is tuple or t is list:
            if len(o) > budget:
                return 0
            stack.extend(o)
        elif t is dict:
            if len(o) > budget:
                return 0
            stack.extend(o.keys())
            stack.extend(o.values())
        else:
            return 0
    return big


_NONE = pickle.dumps(None, 5)
_NO_ARGS = pickle.dumps(((), {}), 5)


def dumps(obj: Any) -> tuple[bytes, list]:
    """Pickle ``obj``; return ``(payload, out_of_band_buffers)``."""
    if obj is None:  # the commonest reply
        return _NONE, []
    if (
        type(obj) is tuple
        and len(obj) == 2
        and type(obj[0]) is tuple
        and not obj[0]
        and type(obj[1]) is dict
        and not obj[1]
    ):  # the commonest arguments: ((), {}); no ``==``, which user objects may overload
        return _NO_ARGS, []
    plain = _plain(obj)
    if plain == 1:
        return pickle.dumps(obj, 5), []
    if plain == 2:
        return _dumps_bytes_oob(obj)
    bufs: list = []

    def cb(pb: pickle.PickleBuffer) -> bool | None:
        try:
            m = pb.raw()
        except BufferError:  # not contiguous: keep it in-band
            return True
        if m.nbytes < OOB_MIN:
            return True
        bufs.append(m)
        return None

    f = io.BytesIO()
    _Pickler(f, protocol=5, buffer_callback=cb).dump(obj)
    return f.getvalue(), bufs


class _BytesPickler(pickle.Pickler):
    """Writes large ``bytes`` as references to out-of-band buffers."""

    def __init__(self, f: Any, bufs: list) -> None:
        super().__init__(f, protocol=5)
        self.bufs = bufs

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is bytes and len(obj) >= BYTES_OOB_MIN:
            self.bufs.append(obj)
            return len(self.bufs) - 1
        return None


class _BytesUnpickler(pickle.Unpickler):
    def __init__(self, f: Any, buffers: list) -> None:
        super().__init__(f, buffers=[b for b in buffers if type(b) is not bytes])
        self.all = buffers

    def persistent_load(self, pid: Any) -> Any:
        if type(pid) is not int or not 0 <= pid < len(self.all) or type(self.all[pid]) is not bytes:
            raise pickle.UnpicklingError(f"bad out-of-band bytes reference {pid!r}")
        return self.all[pid]


def _dumps_bytes_oob(obj: Any) -> tuple[bytes, list]:
    """Pickle a plain ``obj`` whose large ``bytes`` travel out of band: they
    are written to the socket from their own memory and received straight
    into new ``bytes`` objects, never copied into or out of the pickle."""
    bufs: list = []
    f = io.BytesIO()
    f.write(_BYTES_MARK)
    _BytesPickler(f, bufs).dump(obj)
    return f.getvalue(), bufs


def nbytes(payload: Any, buffers: list) -> int:
    """Bytes of a message's payload and out-of-band buffers."""
    return len(payload) + sum(memoryview(b).nbytes for b in buffers) if buffers else len(payload)


def loads(payload: Any, buffers: list) -> Any:
    """Inverse of :func:`dumps` (the per-message path: no lock, no import guard;
    an actor's construction unpickles its class with :func:`loads_importing`)."""
    if payload[:1] == _BYTES_MARK:
        f = io.BytesIO(payload)
        f.read(1)
        return _BytesUnpickler(f, buffers).load()
    return pickle.loads(payload, buffers=buffers)


class _ImportingUnpickler(pickle.Unpickler):
    """Imports each module a payload refers to with
    :func:`monarch_core._proc._construction.import_module` (packages first,
    waiting for one another thread is importing) before looking names up in
    it, and likewise the modules cloudpickle's ``subimport`` brings in (the
    modules a class or function pickled by value refers to)."""

    def find_class(self, module: str, name: str) -> Any:
        if module == _SUBIMPORT[0] and name == _SUBIMPORT[1]:
            return _construction.import_module
        m = sys.modules.get(module)
        if m is None or _construction._initializing(m):
            _construction.import_module(module)
        return super().find_class(module, name)


_SUBIMPORT = (cloudpickle.cloudpickle.subimport.__module__, cloudpickle.cloudpickle.subimport.__qualname__)


#: classes a proc keeps unpickled, keyed by their pickle (:func:`loads_spawn`)
CLASS_CACHE = 256
_classes: dict[bytes, type[Any]] = {}


def dumps_spawn(cls: type, args: tuple, kwargs: dict) -> tuple[bytes, list]:
    """The payload of a spawn: ``cls`` pickled on its own, in band, then its
    constructor arguments (out-of-band buffers as :func:`dumps`).

    The class travels as its own pickle so that a proc unpickles each class
    once (:func:`loads_spawn`): a class defined in ``__main__`` is pickled by
    value, with its methods' code and the globals they read, and rebuilding
    it cost more than the rest of an actor's construction.  It is still
    pickled at every spawn, so a spawn always carries the class and globals
    as they are when it is called."""
    f = io.BytesIO()
    _Pickler(f, protocol=5).dump(cls)
    return dumps((f.getvalue(), args, kwargs))


def loads_spawn(payload: Any, buffers: list) -> tuple[Any, tuple, dict]:
    """Inverse of :func:`dumps_spawn`: ``(cls, args, kwargs)``, its imports
    made as :func:`loads_importing` makes them (the caller holds the proc's
    construction turn).  A class whose pickle this proc has unpickled before
    is the same class object (as an importable class is), not a copy rebuilt
    over it; the last :data:`CLASS_CACHE` classes are kept."""
    data, args, kwargs = loads_importing(payload, buffers)
    cls = _classes.get(data)
    if cls is None:
        cls = loads_importing(data, [])
        if len(_classes) >= CLASS_CACHE:
            del _classes[next(iter(_classes))]
        _classes[data] = cls
    return cls, args, kwargs


def loads_importing(payload: Any, buffers: list) -> Any:
    """:func:`loads` for a payload that may import modules the first time (an
    actor's class and constructor arguments): its imports go through
    :func:`monarch_core._proc._construction.import_module`.  The caller holds
    the proc's construction turn, so no other construction imports meanwhile."""
    if payload[:1] == _BYTES_MARK:
        return loads(payload, buffers)
    return _ImportingUnpickler(io.BytesIO(payload), buffers=buffers).load()
