"""The runtime's own events: what the proc runtime and the mesh API tell the code that watches them.

A :class:`~._state.ProcRuntime` holds one
:class:`~monarch_core._kernel._events.EventBus` (``rt.events``) that carries
the events of :data:`EVENTS`, and only those (an unknown name is refused,
``KeyError`` naming the known ones).  The runtime and the mesh API emit them
where they happen (:func:`._state.emit`: on the current runtime's bus, heard
by nobody while the process has no runtime); whoever watches the runtime
subscribes explicitly where the runtime is assembled: telemetry
(``_telemetry._runtime.subscribe``) in a client (``_launch._start``) and in a
proc (``_launch._proc_main``), then the client's status record for ``monarch
status`` (``_launch._client_status.subscribe``) in a client.  A worker loop's
runtime has no listener.

Each event is emitted with keyword arguments -- a listener is called
``fn(**arguments)`` with exactly the names :data:`EVENTS` lists -- on the
thread named below, which the listener must not block.  A listener that raises
is logged on ``monarch.events`` and the others still hear the event; the code
that emitted it goes on.  Events are rare (a mesh or a proc starts or ends, an
actor fails): never per message.  What runs per call -- a call's and an
endpoint run's instrumentation -- is the runtime's declared
:class:`~._instrumentation.Instrumentation`, called directly.

Host meshes (emitted by the mesh API in the process that owns the mesh):

``host_mesh_spawned(mesh, hosts, scheduler)``
    host mesh ``mesh`` (its name) is up on ``hosts`` (their names, a list),
    allocated by ``scheduler`` (its name, ``"this_host"``, ``"attach"``, or
    None); the caller's thread.
``host_lost(mesh, host_name, reason)``
    host ``host_name`` of host mesh ``mesh`` is lost (``reason``: why); its
    procs fail next.  Any thread (the scheduler's, the kernel's loop).
``host_mesh_stopping(mesh, shutdown)``
    ``HostMesh.stop()`` (``shutdown`` False: the hosts are kept) or
    ``shutdown()`` (True: they are given back) began; the caller's thread.
``host_mesh_stopped(mesh, shutdown)``
    that stop is complete (after the allocation's release, for a shutdown);
    the thread that completed it (the kernel's loop, usually).

Proc meshes and procs (emitted in the process that spawned them):

``proc_mesh_spawned(mesh, slots, extent, host_mesh)``
    proc mesh ``mesh`` was spawned on host mesh ``host_mesh`` (its name):
    ``slots``, one ``_launch._spawn.ProcSlot`` per proc in rank order, and
    ``extent``, the mesh's ``Extent``; the caller's thread.
``proc_ready(proc_id, pid, last)``
    proc ``proc_id`` (OS pid ``pid``, None when unknown) reported ready;
    ``last``: it is the last of its mesh.  The kernel's loop (where the
    launch's status port is delivered).
``proc_ended(proc_id, reason, stopped)``
    a proc this process knows ended (``stopped``: on purpose, not a failure;
    ``reason``: what was observed); the thread of the kernel's
    ``proc_failed`` event (its loop).
``proc_mesh_stopping(mesh, reason)``
    ``ProcMesh.stop()`` began stopping the procs of ``mesh``; the caller's thread.
``proc_mesh_stopped(mesh)``
    those procs are gone, and what they sent before (output, telemetry) was
    handled; before ``stop()`` returns, on the kernel's loop.
``proc_ending()``
    this proc's actors have stopped and it is about to end: what a listener
    holds for the root goes out now (the proc's stopping thread, before the
    last acknowledgements are flushed).

Actor meshes and actors:

``actor_mesh_spawned(mesh, proc_mesh, init)``
    actor mesh ``mesh`` (the ``ActorMesh``) was sent to proc mesh
    ``proc_mesh`` (its name); ``init`` (a ``_port.GatherReplies``) collects
    the answers of its ``__init__`` s (``init.cell`` resolves when all came,
    or at the first error).  The caller's thread.
``actor_mesh_stopping(mesh, reason, done)``
    ``ActorMesh.stop()`` began; ``done`` (a ``_future.Cell``) resolves
    when every actor stopped.  The caller's thread.
``actor_mesh_released(mesh_key, class_name, done)``
    this process no longer calls actor mesh ``mesh_key`` (of class
    ``class_name``), which is stopped -- by its own ``stop()`` or with its
    procs -- once ``done`` (a ``_future.Cell``) resolves.  The caller's thread.
``actor_failed(host, cause, category)``
    an actor of this proc died: ``host`` (its ``_host.ActorHost``),
    ``cause`` (the traceback or reason, text), ``category`` (``"user"``,
    ``"system"``...).  The thread it died on.
``actor_finished(host)``
    the stop of actor ``host`` (an ``_host.ActorHost``) of this proc is
    complete: nothing of the proc keeps it.  Any thread.

Supervision (in the process that owns the failed mesh):

``supervision_event(failure, report, owner_host, runtime)``
    ``failure`` (a ``_supervision.MeshFailure``, from ``report``, the
    failed rank's report dict) reached its owner: the actor ``owner_host``
    (an ``_host.ActorHost``), or this process itself when None (``runtime``:
    this ``ProcRuntime``, for whether it is the client).  Before the owner
    is told; the thread that handles the report (the kernel's loop, or the
    failing actor's for a mesh owned in its own proc).
``supervision_handled(mesh, handled_by, handled)``
    the owner of mesh ``mesh`` decided about its failure: ``handled_by``
    (``"<actor>.__supervise__"`` or ``"unhandled_fault_hook"``) handled it
    (``handled`` True) or not.  The owner's thread.
"""

from __future__ import annotations

__all__ = ["EVENTS"]

#: event name -> the names of its arguments (each listener is called with them as keywords).
EVENTS: dict[str, tuple[str, ...]] = {
    "host_mesh_spawned": ("mesh", "hosts", "scheduler"),
    "host_lost": ("mesh", "host_name", "reason"),
    "host_mesh_stopping": ("mesh", "shutdown"),
    "host_mesh_stopped": ("mesh", "shutdown"),
    "proc_mesh_spawned": ("mesh", "slots", "extent", "host_mesh"),
    "proc_ready": ("proc_id", "pid", "last"),
    "proc_ended": ("proc_id", "reason", "stopped"),
    "proc_mesh_stopping": ("mesh", "reason"),
    "proc_mesh_stopped": ("mesh",),
    "proc_ending": (),
    "actor_mesh_spawned": ("mesh", "proc_mesh", "init"),
    "actor_mesh_stopping": ("mesh", "reason", "done"),
    "actor_mesh_released": ("mesh_key", "class_name", "done"),
    "actor_failed": ("host", "cause", "category"),
    "actor_finished": ("host",),
    "supervision_event": ("failure", "report", "owner_host", "runtime"),
    "supervision_handled": ("mesh", "handled_by", "handled"),
}
