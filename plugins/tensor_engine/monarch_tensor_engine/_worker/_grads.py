"""``grad_generator``, the procs' side: gradients one at a time, while the
backward runs on (the client's side is ``_client._grads``).

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

import threading
import traceback
from typing import Any

import torch
from torch.utils._pytree import tree_map

from monarch_core.runtime import format_duration
from monarch_tensor_engine._protocol import WAIT_S, TensorOpError
from monarch_tensor_engine._worker._env import Poison


class Backward:
    """The procs' side: one backward, its gradients as they come."""

    def __init__(self, worker: Any, roots: Any, params: Any, grad_roots: Any) -> None:
        self.worker = worker
        self.values: list[Any] = [None] * len(params)
        self.ready = [threading.Event() for _ in params]
        self.hooks: list[Any] = []
        poison = worker._poisoned((roots, params, grad_roots))
        if poison is not None:
            self._fail(poison.error)
            return
        r, p, g = tree_map(worker._value, (roots, params, grad_roots))
        try:
            for i, t in enumerate(p):
                self.hooks.append(t.register_hook(self._hook(i)))
        except Exception as e:  # noqa: BLE001 - contained: the gradients are poisoned
            self._remove_hooks()
            self._fail(TensorOpError(f"grad_generator failed on the proc at {worker.where}: {type(e).__name__}: {e}",
                                     "grad_generator", worker.where))
            return
        self.thread = threading.Thread(target=self._run, args=(r, p, g), daemon=True, name="monarch-backward")
        self.thread.start()

    def _hook(self, i: int) -> Any:
        def hand_over(grad: torch.Tensor) -> None:
            if not self.ready[i].is_set():
                self.values[i] = grad
                self.ready[i].set()

        return hand_over

    def _run(self, roots: list, params: list, grad_roots: Any) -> None:
        try:
            grads = torch.autograd.grad(roots, params, grad_outputs=grad_roots, allow_unused=True)
        except Exception as e:  # noqa: BLE001 - contained: the gradients are poisoned
            tb = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-6:])
            self._fail(TensorOpError(f"the backward of grad_generator failed on the proc at {self.worker.where}: "
                                     f"{type(e).__name__}: {e}\n{tb}", "grad_generator", self.worker.where))
        else:
            for i, g in enumerate(grads):
                if not self.ready[i].is_set():
                    self.values[i] = g
                    self.ready[i].set()
        finally:
            self._remove_hooks()

    def _remove_hooks(self) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks = []

    def _fail(self, error: Any) -> None:
        for i, ev in enumerate(self.ready):
            if not ev.is_set():
                self.values[i] = Poison(error)
                ev.set()

    def take(self, i: int) -> Any:
        """Gradient ``i`` (a tensor or a ``Poison``), once the backward has it."""
        if not self.ready[i].wait(WAIT_S):
            return Poison(TensorOpError(f"grad_generator: gradient {i} did not come within "
                                        f"{format_duration(WAIT_S)} on the proc at {self.worker.where}",
                                        "grad_generator", self.worker.where))
        v = self.values[i]
        self.values[i] = None
        return v

    def finish(self) -> None:
        """The client is done with this generator (the backward may still be running: it ends on its own)."""
        self.values = [None] * len(self.values)
