"""monarch-debugger: ``breakpoint()`` in actors, and the ``monarch debug`` CLI
(docs/debugging.md).  A plugin of monarch-core: it attaches through the
bootstrap and lifecycle hooks (:mod:`.plugin`) and the ``monarch.cli`` entry
point, and uses only the public API.

Modules, by the process they run in:

* every proc: :mod:`.plugin` (its hooks), :mod:`._hook` (the
  ``sys.breakpointhook`` the plugin's ``monarch_proc_setup`` installs, and the
  post-mortem check its ``monarch_endpoint_raised`` runs; light, imports the
  rest when a breakpoint is hit) and
  :mod:`._session` (the remote pdb: a ``pdb.Pdb`` whose input and output travel
  to the client's debug controller as endpoint calls);
* the client: :mod:`._controller` (the ``DebugController`` actor, spawned on
  the root client at the first breakpoint), :mod:`._registry` (the stopped
  sessions it keeps, and the debugger's operations on them) and
  :mod:`._server` (the TCP server ``monarch debug`` talks to);
* the CLI: :mod:`._cli` (the ``cmd`` command loop) and :mod:`._ranks` (the
  ``ranks(...)`` grammar);
* shared: :mod:`._protocol` (the CLI <-> server wire format, the token file),
  :mod:`._state` (this process's debugger state: armed, why it stops; the
  hook reads it, the session writes it) and :mod:`._errors` (``DebuggerError``,
  a ``MonarchError``, the base of the debugger's errors).
"""
