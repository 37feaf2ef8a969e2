"""``monarch_core.spmd`` is a façade over the monarch-spmd plugin, and the
rendezvous address is the core's (``monarch_core.runtime.host_address``), in
child interpreters: importing the façade loads nothing; without the plugin
(``MONARCH_DISABLED_PLUGINS=spmd``) it still imports, ``AddrType`` and
``host_address`` still work, and the plugin's names raise ``ImportError``
naming the distribution and its install line."""

from __future__ import annotations

import json

from _helpers.clients import describe, run_code


def test_importing_the_facade_loads_neither_the_plugin_nor_the_runtime() -> None:
    res = run_code("""
        import json, sys
        import monarch_core.spmd
        print(json.dumps(sorted(m for m in sys.modules if m.startswith(("monarch_spmd", "monarch_core.runtime",
                                                                        "monarch_core._plugins", "pluggy", "trio")))))
    """)
    assert res.returncode == 0, describe(res)
    assert json.loads(res.stdout.strip().splitlines()[-1]) == [], res.stdout


def test_without_the_plugin_the_facade_imports_and_using_it_says_what_to_install() -> None:
    res = run_code("""
        import monarch_core.spmd as spmd
        from monarch_core import runtime
        print("all", sorted(spmd.__all__) == sorted(dir(spmd)))
        from monarch_core.spmd import AddrType, host_address   # the core's: no plugin needed
        print("core", AddrType is runtime.AddrType, host_address is runtime.host_address)
        for name in spmd.PROVIDED:
            try:
                getattr(spmd, name)
            except ImportError as e:
                print("error", name, e)
        try:
            from monarch_core.spmd import setup_torch_elastic_env
        except ImportError as e:
            print("from-import", e)
    """, env={"MONARCH_DISABLED_PLUGINS": "spmd"})
    assert res.returncode == 0, describe(res)
    out = res.stdout
    assert "all True" in out and "core True True" in out, out
    errors = [line for line in out.splitlines() if line.startswith("error ")]
    assert len(errors) == 7, out
    for line in errors + [line for line in out.splitlines() if line.startswith("from-import ")]:
        assert "monarch_core.spmd needs a plugin that provides SPMDActor" in line, line
        assert "monarch-spmd" in line and "pip install . ./plugins/spmd (in a monarch-core checkout)" in line, line
    assert "from-import " in out, out


#: prints what ``host_address`` answers in a fresh client whose transport is ``sys.argv[1]`` (ipc or tcp)
_HOST_ADDRESS = """
import json, sys
from monarch_core import runtime
from monarch_core.runtime import AddrType, host_address, local_ref, master_address
out = {"started_before": runtime.started()}
if sys.argv[1] == "tcp":
    from monarch_core.actor import enable_transport
    enable_transport("tcp://127.0.0.1:0")
addr = host_address()
out.update(started_after=runtime.started(), addr=addr, url=local_ref()[1],
           same=addr == master_address(local_ref()[1]), v4=host_address(AddrType.IPv4))
try:
    out["v6"] = host_address(AddrType.IPv6)
except ValueError as e:
    out["v6_error"] = str(e)
print(json.dumps(out))
"""


def test_host_address_is_the_host_of_the_address_this_process_listens_on() -> None:
    """The contract of ``runtime.host_address`` (what ``SPMDActor.get_host_port``
    and the tensor engine's store use): the host of ``local_ref()``'s address,
    loopback for a local transport (IPv6 loopback when IPv6 is asked for), an
    IP address of the asked family for tcp, ``ValueError`` for a family the
    transport's literal address is not."""
    res = run_code(_HOST_ADDRESS, "ipc")
    assert res.returncode == 0, describe(res)
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["started_before"] is False and got["started_after"] is True  # it starts the runtime it asks
    assert got["url"].startswith("ipc://") and got["same"] is True
    assert (got["addr"], got["v4"], got["v6"]) == ("127.0.0.1", "127.0.0.1", "::1")

    res = run_code(_HOST_ADDRESS, "tcp")
    assert res.returncode == 0, describe(res)
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["url"].startswith("tcp://127.0.0.1:") and got["same"] is True
    assert (got["addr"], got["v4"]) == ("127.0.0.1", "127.0.0.1")
    assert "IPv4 address" in got["v6_error"] and "enable_transport" in got["v6_error"]
