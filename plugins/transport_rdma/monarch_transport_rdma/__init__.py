"""monarch-transport-rdma: one-sided data paths behind ``monarch_core.rdma.RDMABuffer``.

* ``ibverbs`` (:mod:`._verbs`): RDMA READ/WRITE over RC queue pairs, through
  ``pyverbs`` (imported only when the backend is first used);
* ``process_vm`` (:mod:`._cma`): ``process_vm_readv``/``process_vm_writev``
  between procs of one host.

Registered through the ``monarch_rdma_backends`` hook (:mod:`.plugin`).
"""
