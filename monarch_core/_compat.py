"""Small compatibility helpers (Python 3.10 lacks exception groups and tomllib),
and the reference's top-level names that ``monarch_core`` resolves lazily."""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):  # pragma: no cover - version dependent
    BaseExceptionGroup = BaseExceptionGroup  # noqa: A001,PLW0127
else:  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup  # type: ignore[no-redef]

__all__ = ["BaseExceptionGroup", "SPMD_NAMES", "TENSOR_ENGINE_NAMES", "leaf_exceptions", "first_leaf"]

#: The reference's top-level distributed-tensor names: attributes of
#: ``monarch_core`` resolved through the tensor engine plugin
#: (``import monarch_core as monarch; monarch.fetch_shard(...)``).
TENSOR_ENGINE_NAMES = (
    "RemoteProcessGroup", "Stream", "Tensor", "call_on_shard_and_fetch", "fetch_shard", "get_active_mesh",
    "get_active_stream", "grad_generator", "inspect", "no_mesh", "reduce", "reduce_", "remote", "show", "slice_mesh",
    "to_mesh",
)

#: The names of ``monarch_core.spmd`` (the reference's ``monarch.spmd``) that
#: the plugin answering ``monarch_spmd_api`` supplies.
SPMD_NAMES = ("JobFailed", "RankFailure", "SPMDActor", "ScriptError", "launch", "setup_torch_elastic_env",
              "setup_torch_elastic_env_async")


def leaf_exceptions(exc: BaseException) -> list[BaseException]:
    """Flatten nested exception groups into their leaf exceptions."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in leaf_exceptions(e)]
    return [exc]


def first_leaf(exc: BaseException, *, skip: tuple[type[BaseException], ...] = ()) -> BaseException:
    """The first leaf of ``exc`` that is not an instance of ``skip`` (or the first leaf)."""
    leaves = leaf_exceptions(exc)  # (never empty: an exception group has at least one exception)
    return next((e for e in leaves if not isinstance(e, skip)), leaves[0])
