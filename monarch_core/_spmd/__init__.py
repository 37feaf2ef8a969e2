"""The SPMD layer behind ``monarch_core.spmd``: torchrun's environment from a
proc's mesh coordinates (``_env``), a rendezvous address every rank can reach
(``_address``), running a script or module as ``__main__`` in a proc
(``_script``), the actor and the setup functions (``_actor``), and the
``monarch torchrun`` command (``_command``)."""
