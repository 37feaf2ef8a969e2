"""monarch-tensor-engine: distributed tensors driven from one controller.

Inside ``with proc_mesh.activate():`` every torch operation the client
issues runs on every proc of the mesh; the client holds
:class:`~monarch_tensor_engine._tensor.Tensor` handles whose shape, dtype and
device come from running the same operation on fake tensors locally, and
sends the operations, in batches, without waiting for the procs.  Values come
back with ``fetch_shard``/``inspect``; collectives are ``Tensor.reduce``.
Attached to monarch-core through the ``monarch_tensor_engine`` hook
(:mod:`.plugin`); the names are importable from ``monarch_core`` itself.
See the project's ``docs/tensors.md``.
"""
