"""monarch-transport-rdma: ``monarch_core.rdma.RDMABuffer`` and its one-sided data paths.

* ``RDMABuffer``/``RDMAAction`` (:mod:`._buffers`, provided to
  ``monarch_core.rdma`` through the ``monarch_rdma_api`` hook), with the
  ``channel`` fallback through the owner proc's session;

* ``ibverbs`` (:mod:`._verbs`): RDMA READ/WRITE over RC queue pairs, through
  ``pyverbs`` (imported only when the backend is first used);
* ``process_vm`` (:mod:`._cma`): ``process_vm_readv``/``process_vm_writev``
  between procs of one host.

Registered through the ``monarch_rdma_backends`` hook (:mod:`.plugin`).
"""
