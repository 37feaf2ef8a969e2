"""``grad_generator``, the client's side: gradients one at a time, while the
backward runs on (the procs' side is ``_worker._grads``).

Contract:

* The client runs the backward on the fake tensors (the gradients' shapes),
  then sends one ``grads`` command and, for each gradient the user takes
  from the generator, a ``grad`` command that binds it to a new tensor.
* On the procs, ``grads`` starts the backward on a thread of its own, with
  a hook on each tensor of ``with_respect_to`` that hands its gradient over
  the moment the engine has it (the full gradient: a tensor used twice has
  both uses summed first).  ``grad`` waits for that gradient only, so the
  commands after it (a reduction on a comms stream) run while the backward
  goes on to the earlier layers.  Once a tensor's gradient is complete, no
  node of the backward still reads that tensor, so updating it in place
  then is safe.
* A backward that fails poisons every gradient not handed over yet; a
  poisoned input poisons them all.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch

from monarch_tensor_engine._client import _active, _streams
from monarch_tensor_engine._client._tensor import Tensor
from monarch_tensor_engine._protocol import EndGrads, Ref, StartGrads, TakeGrad


def grad_generator(roots: Any, with_respect_to: Any, grad_roots: Any = None) -> Iterator[Any]:
    """The client's side (see the module docstring and ``api.grad_generator``)."""
    ctl = _active.active()
    if ctl is None:
        raise RuntimeError("grad_generator() runs inside `with mesh.activate():`")
    params = list(with_respect_to)
    root_list: list[Any] = [roots] if isinstance(roots, torch.Tensor) else list(roots)
    grad_list: list[Any] | None = None if grad_roots is None else (
        [grad_roots] if isinstance(grad_roots, torch.Tensor) else list(grad_roots))
    if not params:
        return
    for t in root_list + params + (grad_list or []):
        if not isinstance(t, Tensor) or t._ctl is not ctl:
            raise TypeError(f"grad_generator() takes distributed tensors of the active mesh {ctl.mesh_name!r}, got "
                            f"{type(t).__name__}")
        _streams.check_use(t, False, "grad_generator")
    with torch._C.DisableTorchFunction(), ctl.fake_mode:
        fakes = torch.autograd.grad([r._fake for r in root_list], [p._fake for p in params],
                                    grad_outputs=None if grad_list is None else [g._fake for g in grad_list],
                                    allow_unused=True)
    stream = _streams.get_active_stream()
    gen = next(ctl.ids)

    def refs(ts: list | None) -> list | None:
        return None if ts is None else [Ref(t._id) for t in ts]

    ctl.send(StartGrads(gen, refs(root_list), refs(params), refs(grad_list)), stream)
    try:
        for i, fake in enumerate(fakes):
            if fake is None:  # this tensor took no part in computing the roots
                yield None
                continue
            h = ctl.new_handle(fake, stream)
            ctl.send(TakeGrad(gen, i, h._id), stream)
            yield h
    finally:
        ctl.send(EndGrads(gen), stream)
