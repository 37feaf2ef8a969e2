"""``RDMABuffer`` and ``RDMAAction``: the classes behind ``monarch_core.rdma``, built
on the public runtime seam (``monarch_core.runtime``: ports, lifecycle events).

One module per job: :mod:`._memory` (what memory an object is),
:mod:`._service` (the owner side: registrations, the proc's RDMA service),
:mod:`._backends` (the backends, resolved once; a connection per owner proc),
:mod:`._channel` (the built-in fallback over the proc's session),
:mod:`._transfer` (running transfers: threads, deadlines, staging),
:mod:`._buffer` (the public classes).  See docs/rdma.md.
"""
