"""The registries behind ``monarch_core.testing.patch_actor`` and
``patch_tensor_engine`` (see there), and the two places the mesh API asks
them: ``ProcMesh.spawn`` (:func:`spawn_class`) and ``ProcMesh.activate``
(:func:`activation_mesh`).

A patch is entered in one process (usually the test's client) and acts on the
spawns that process makes.  ``patch_tensor_engine`` must act where the
patched actor runs, in its proc: the spawn sends a subclass of the actor's
class (same name) whose ``__init__`` first registers the factory for that
actor there, so every ``activate()`` the actor makes, its ``__init__``
included, goes to the factory's mesh.
"""

from __future__ import annotations

import functools
import inspect
import threading
import weakref
from types import TracebackType
from typing import Any, Callable, Generic, Optional, TypeVar

from monarch_core._proc import _state

__all__ = ["EngineFactory", "Patch", "activation_mesh", "actor_patches", "engine_patches", "spawn_class"]

#: a tensor engine factory: the actor's proc mesh -> the mesh its ``activate()`` uses instead
EngineFactory = Callable[[Any], Any]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

_lock = threading.Lock()
#: actor class -> the class spawned instead (entered patches, innermost last wins)
actor_patches: dict[type, type] = {}
#: actor class -> the tensor engine factory of its actors
engine_patches: dict[type, EngineFactory] = {}
#: (in a proc) actor host -> [factory, the factory's mesh once made]
_engines: "weakref.WeakKeyDictionary[Any, list]" = weakref.WeakKeyDictionary()

#: the attribute of a class made by :func:`_engine_class`: its factory
ENGINE_ATTR = "__monarch_engine_factory__"


class Patch(Generic[T]):
    """A registry entry while entered: a context manager (sync and async) and
    a decorator (of sync and async functions).  Entries nest: leaving one
    restores what was registered for its key before."""

    def __init__(self, registry: dict[type, T], key: type, value: T) -> None:
        self._registry, self._key, self._value = registry, key, value
        self._saved: list[tuple[bool, Optional[T]]] = []

    def __enter__(self) -> T:
        with _lock:
            had = self._key in self._registry
            self._saved.append((had, self._registry.get(self._key)))
            self._registry[self._key] = self._value
        return self._value

    def __exit__(self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        with _lock:
            had, previous = self._saved.pop()
            if had:
                self._registry[self._key] = previous  # type: ignore[assignment]
            else:
                self._registry.pop(self._key, None)

    async def __aenter__(self) -> T:
        return self.__enter__()

    async def __aexit__(self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException],
                        tb: Optional[TracebackType]) -> None:
        self.__exit__(exc_type, exc, tb)

    def __call__(self, fn: F) -> F:
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                with self:
                    return await fn(*args, **kwargs)

            return run_async  # type: ignore[return-value]

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return run  # type: ignore[return-value]


def register_engine(factory: EngineFactory) -> None:
    """(In a proc, from a patched actor's ``__init__``) the running actor's
    ``activate()`` calls go to ``factory``'s mesh."""
    host = _state.current_actor.get()
    if host is not None:
        _engines[host] = [factory, None]


def _engine_class(cls: type[Any], factory: EngineFactory) -> type:
    """A subclass of ``cls`` (same names) whose ``__init__`` registers ``factory`` first."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        register_engine(factory)
        cls.__init__(self, *args, **kwargs)  # type: ignore[misc]

    __init__.__signature__ = inspect.signature(cls.__init__)  # type: ignore[attr-defined]
    return type(cls.__name__, (cls,), {"__init__": __init__, "__module__": cls.__module__,
                                       "__qualname__": cls.__qualname__, "__doc__": cls.__doc__,
                                       ENGINE_ATTR: factory})


def spawn_class(cls: type) -> type:
    """The class ``ProcMesh.spawn(name, cls)`` spawns: ``cls``, or its patches'."""
    if not actor_patches and not engine_patches:
        return cls
    with _lock:
        spawned = actor_patches.get(cls, cls)
        factory = engine_patches.get(cls) or engine_patches.get(spawned)
    return spawned if factory is None else _engine_class(spawned, factory)


def activation_mesh(mesh: Any) -> Any:
    """The mesh ``mesh.activate()`` activates: ``mesh``, or (in an actor whose
    tensor engine is patched) its factory's mesh, made once per actor."""
    if not _engines:
        return mesh
    host = _state.current_actor.get()
    entry = _engines.get(host) if host is not None else None
    if entry is None:
        return mesh
    if entry[1] is None:
        entry[1] = entry[0](mesh)
    return entry[1]
