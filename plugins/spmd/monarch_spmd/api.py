"""What ``monarch_core.spmd`` re-exports (the ``monarch_spmd_api`` hook
answers with this module): every name of ``monarch_core.hookspecs.SPMD_NAMES``."""

from __future__ import annotations

from monarch_spmd._actor import SPMDActor, setup_torch_elastic_env, setup_torch_elastic_env_async
from monarch_spmd._launch import JobFailed, RankFailure, launch
from monarch_spmd._script import ScriptError

__all__ = ["JobFailed", "RankFailure", "SPMDActor", "ScriptError", "launch", "setup_torch_elastic_env",
           "setup_torch_elastic_env_async"]
