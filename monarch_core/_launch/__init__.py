"""Launching procs: everything from "a proc is wanted" to "its kernel answered".

One private module per job; arrows point down (this package imports
``_kernel``; the kernel never imports it -- it watches children through its
own ``ChildProcess`` protocol).  Process entry points (``_start`` for the
client, ``_proc_main``, ``_worker``, the fork server's preload) are composition
roots: they build the process's runtime (kernel, agent, ``ProcRuntime`` and its
instrumentation, telemetry's) with the one :func:`~._start.build_runtime`, and
subscribe telemetry (and a client's status record) to its events.  The
pipeline: ``HostMesh.spawn_procs`` checks its arguments and plans a
:class:`~._spawn.Launch` (per host, the :class:`ProcSpec` s of its procs); the
launch starts them here or asks worker loops to, and collects their
hello/ready; the proc decodes the same spec; ``ProcMesh.stop`` ends them
through :func:`~._spawn.stop_procs`.

* ``_start``     -- the client's runtime: started on first use, stopped at shutdown;
  :func:`~._start.build_runtime`, the one assembly of a runtime;
* ``_spec``      -- :class:`ProcSpec`, the typed description of one proc to start,
  and its one encoding for the proc (``to_env``/``from_env``);
* ``_bootstrap`` -- ``BootstrapCommand`` (the OS command), ``proc_bind`` checks;
* ``_devices``   -- per-proc devices: the index the client plans, the
  ``CUDA_VISIBLE_DEVICES`` the starting host maps it to;
* ``_spawn``     -- start a spec on this host (fork or exec); the client side of
  a spawn (``Launch``: local, or through a worker loop; hello/ready); stopping
  procs (ask, SIGTERM, SIGKILL);
* ``_fork_server`` -- the fork server, spawner's side (one zygote per kernel;
  started with the runtime by ``this_host()``, or by the worker loop);
* ``_zygote``    -- the zygote process that forks procs;
* ``_children``  -- exec'd child processes, awaited through pidfds;
* ``_proc_main`` -- the entry point of a proc process;
* ``_worker``    -- the worker loop of a host: starts procs for remote clients;
* ``_alloc``     -- allocating hosts through a scheduler plugin: off the kernel
  loop, with a timeout, readiness, lost-host reports and release on every exit path.
"""
