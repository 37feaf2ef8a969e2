"""The plugin manager: built-ins, entry points, disabling, broken and
third-party plugins, unknown names, and ``monarch plugins``.

The registry is process-wide and built once, so every test that depends on the
environment (``MONARCH_DISABLED_PLUGINS``, extra distributions on ``sys.path``)
runs its checks in a fresh interpreter (``subprocess.run([sys.executable,
"-c", code])``).  Throwaway distributions are real ``*.dist-info`` directories
in ``tmp_path``, found by ``importlib.metadata`` through ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
from importlib import metadata

import pytest

from monarch_core._builtins._inproc import InprocTransport
from monarch_core._builtins._local import LocalScheduler
from monarch_core._plugins import PluginRegistry, install_hint
from monarch_core.actor import Actor, endpoint
from monarch_core.errors import PluginError, UnknownSchedulerError, UnknownTransportError

from _helpers.clients import child_env

HERE = os.path.dirname(os.path.abspath(__file__))
CORE_VERSION = metadata.version("monarch-core")
TCP_VERSION = metadata.version("monarch-transport-tcp")
MONARCH_CLI = os.path.join(os.path.dirname(sys.executable), "monarch")


def _project_schedulers() -> dict[str, list[str]]:
    """The project's scheduler plugins installed beside the core (scripts/test.sh
    installs them): entry-point name -> the schedulers it provides.  These
    tests are about the plugin manager: they leave those plugins out of what
    they compare."""
    out = {}
    for ep in metadata.entry_points(group="monarch"):
        if ep.name in ("scheduler_ssh", "scheduler_slurm"):
            out[ep.name] = sorted(spec.name for spec in ep.load().monarch_schedulers())
    return out


OTHERS = _project_schedulers()
OTHER_SCHEDULERS = sorted(n for names in OTHERS.values() for n in names)
#: monarch-transport-rdma, when installed (it provides RDMA backends, no transport): left out too.
RDMA = {ep.name for ep in metadata.entry_points(group="monarch") if ep.name == "transport_rdma"}
#: monarch-telemetry-otel, the dashboard and the debugger, when installed (sinks and lifecycle
#: hooks, no transport or scheduler), the tensor engine, monarch-spmd, monarch-compat (no hooks: it
#: adds the reference's attribute names in every proc), and monarch-core's own sink plugin
#: ``telemetry_files``: left out too.
TELEMETRY = {ep.name for ep in metadata.entry_points(group="monarch")
             if ep.name in ("telemetry_otel", "dashboard", "debugger", "telemetry_files", "tensor_engine", "spmd",
                            "compat")}
TELEMETRY_FILES_LINE = f"telemetry_files (monarch-core=={CORE_VERSION})  hooks: monarch_telemetry_sinks"
BUILTIN_LINE = f"builtin (monarch-core=={CORE_VERSION})  transports: inproc, ipc; schedulers: local"


def _mine(names: list[str]) -> list[str]:
    """``names`` without the project's scheduler, RDMA and telemetry plugins."""
    return [n for n in names if n not in OTHERS and n not in RDMA and n not in TELEMETRY]


def _lines(text: str) -> list[str]:
    """``monarch plugins`` output without the lines of the project's scheduler, RDMA and telemetry plugins."""
    return [line for line in text.splitlines() if line.split(" ", 1)[0] not in {*OTHERS, *RDMA, *TELEMETRY}]


# ---------------------------------------------------------------- actors used by child clients


class WhereAmI(Actor):
    """Reports what a proc sees: its kernel's address, pid, and one variable."""

    @endpoint
    def where(self, var: str) -> dict:
        from monarch_core._proc import _state

        return {"address": _state.current().kernel.address, "pid": os.getpid(), "var": os.environ.get(var)}


# ---------------------------------------------------------------- helpers


def _env(**extra: str | None) -> dict[str, str]:
    """The environment of a child: without ``MONARCH_DISABLED_PLUGINS``, with
    ``extra``; a ``PYTHONPATH`` given goes ahead of this checkout and the
    caller's (so the child runs this checkout's code, not the installed one)."""
    path = extra.pop("PYTHONPATH", None)
    return child_env(extra, path=[path] if path else (), drop=("MONARCH_DISABLED_PLUGINS",))


def _py(code: str, timeout: float = 120, **env: str | None) -> subprocess.CompletedProcess:
    prelude = f"import sys; sys.path.insert(0, {HERE!r})\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(**env),
    )


def _json(res: subprocess.CompletedProcess):  # type: ignore[no-untyped-def]
    assert res.returncode == 0, f"child failed (rc {res.returncode}):\n{res.stderr[-4000:]}"
    return json.loads(res.stdout.strip().splitlines()[-1])


def make_dist(root: pathlib.Path, dist: str, version: str, entry_points: dict[str, str], modules: dict[str, str]) -> None:
    """A minimal installed distribution: ``<dist>-<version>.dist-info`` with
    METADATA and entry_points.txt, plus top-level modules, all under ``root``."""
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    eps = "[monarch]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items())
    (info / "entry_points.txt").write_text(eps)
    for name, src in modules.items():
        (root / f"{name}.py").write_text(textwrap.dedent(src))


BROKEN_MOD = """
raise ImportError("broken_mod needs libfoo.so.3, which is not installed")
"""

DIRT_PLUGIN = '''
"""A third-party transport: Unix sockets as files in one directory."""
import os
import socket as _s
import uuid

import trio

from monarch_core.errors import ConnectError, TransportError
from monarch_core.hookspecs import Transport, TransportSpec, hookimpl
from monarch_core.streams import SocketListener, SocketStream


class DirTransport(Transport):
    name = "dir"

    def default_bind_spec(self):
        return f"dir://{os.environ['MC_DIRT_DIR']}/{uuid.uuid4().hex[:10]}.sock"

    def normalize(self, url):
        if not url.startswith("dir:///"):
            raise ValueError(f"malformed dir address {url!r}; expected dir:///absolute/path")
        return url

    async def listen(self, bind_spec):
        path = self.normalize(bind_spec)[len("dir://"):]
        sock = trio.socket.socket(_s.AF_UNIX, _s.SOCK_STREAM)
        try:
            await sock.bind(path)
            sock.listen(128)
        except OSError as e:
            sock.close()
            raise TransportError(f"cannot listen on {bind_spec}: {e}") from None
        return SocketListener(sock, bind_spec)

    async def connect(self, address):
        sock = trio.socket.socket(_s.AF_UNIX, _s.SOCK_STREAM)
        try:
            await sock.connect(address[len("dir://"):])
        except OSError as e:
            sock.close()
            raise ConnectError(f"cannot connect to {address}: {e}") from None
        return SocketStream(sock, peer=address)


@hookimpl
def monarch_transports():
    return [TransportSpec(name="dir", schemes=("dir",), factory="dirt_plugin:DirTransport",
                          description="Unix sockets in a directory")]


@hookimpl
def monarch_proc_env(proc_name, rank, coords):
    return {"MC_DIRT_RANK": f"{proc_name}:{rank}:{dict(coords)}"}
'''


# ---------------------------------------------------------------- built-ins and entry points


def test_builtins_are_registered_through_the_hooks() -> None:
    res = _py(
        """
        import json
        from monarch_core import _builtins
        from monarch_core._plugins import registry
        reg = registry()
        impls = {h: sorted(i.plugin_name for i in getattr(reg.pm.hook, h).get_hookimpls())
                 for h in ("monarch_transports", "monarch_schedulers")}
        info = {i.name: [i.distribution, i.version, i.transports, i.schedulers] for i in reg.describe()}
        print(json.dumps({
            "builtin_is_module": reg.pm.get_plugin("builtin") is _builtins,
            "impls": impls,
            "inproc": type(reg.transport("inproc")).__qualname__,
            "local": type(reg.scheduler("local")).__qualname__,
            "info": info["builtin"],
        }))
        """
    )
    out = _json(res)
    out["impls"] = {h: _mine(v) for h, v in out["impls"].items()}
    assert out == {
        "builtin_is_module": True,
        "impls": {"monarch_transports": ["builtin", "transport_tcp"], "monarch_schedulers": ["builtin"]},
        "inproc": InprocTransport.__qualname__,
        "local": LocalScheduler.__qualname__,
        "info": ["monarch-core", CORE_VERSION, ["inproc", "ipc"], ["local"]],
    }


def test_transport_tcp_entry_point_is_loaded_and_provides_tcp_and_tls_beside_the_builtin_ipc() -> None:
    res = _py(
        """
        import json
        from monarch_core._plugins import registry
        from monarch_transport_tcp import plugin
        from monarch_core._builtins._ipc import IpcTransport
        from monarch_transport_tcp._tcp import TcpTransport, TlsTransport
        reg = registry()
        info = {i.name: [i.distribution, i.version, i.transports] for i in reg.describe()}
        ipc = reg.transport("ipc")
        print(json.dumps({
            "plugin_module": reg.pm.get_plugin("transport_tcp") is plugin,
            "info": info["transport_tcp"],
            "ipc": isinstance(ipc, IpcTransport),
            "unix_same": reg.transport("unix") is ipc,
            "tcp": isinstance(reg.transport("tcp"), TcpTransport),
            "tls": isinstance(reg.transport("tls"), TlsTransport),
            "tcp_once": reg.transport("tcp") is reg.transport("tcp"),
            "names": [reg.transport(n).name for n in ("ipc", "unix", "tcp", "tls")],
            "failed": reg.failed,
            "order": [i.name for i in reg.infos],
        }))
        """
    )
    out = _json(res)
    out["order"] = _mine(out["order"])
    assert out == {
        "plugin_module": True,
        "info": ["monarch-transport-tcp", TCP_VERSION, ["tcp", "tls"]],
        "ipc": True,
        "unix_same": True,
        "tcp": True,
        "tls": True,
        "tcp_once": True,
        "names": ["ipc", "ipc", "tcp", "tls"],
        "failed": {},
        "order": ["builtin", "transport_tcp"],
    }


@pytest.mark.parametrize("value", ["transport_tcp", " transport_tcp ", "nothing,transport_tcp", "transport_tcp,,"])
def test_disabled_transport_tcp_makes_its_transports_unknown_naming_the_package_and_why(value: str) -> None:
    res = _py(
        """
        import json
        from monarch_core._plugins import registry
        from monarch_core.errors import UnknownTransportError
        reg = registry()
        out = {"plugins": [i.name for i in reg.infos], "blocked": sorted(reg.blocked)}
        for name in ("ipc", "unix", "tcp", "tls"):
            try:
                reg.transport(name)
                out[name] = None
            except UnknownTransportError as e:
                out[name] = str(e)
        out["inproc"] = type(reg.transport("inproc")).__name__
        print(json.dumps(out))
        """,
        MONARCH_DISABLED_PLUGINS=value,
    )
    out = _json(res)
    assert _mine(out["plugins"]) == ["builtin"]
    assert "transport_tcp" in out["blocked"]
    assert out["inproc"] == "InprocTransport"
    assert out["ipc"] is None and out["unix"] is None, "the built-in ipc must not depend on transport_tcp"
    for name in ("tcp", "tls"):
        msg = out[name]
        assert msg is not None, f"{name} still resolves with transport_tcp disabled"
        assert f"no installed plugin provides the transport {name!r}" in msg
        assert "Installed transports: ['inproc', 'ipc']" in msg
        assert "'monarch-transport-tcp'" not in msg and "is provided by monarch-transport-tcp" in msg
        assert f"disabled by MONARCH_DISABLED_PLUGINS={value}" in msg


def test_without_transport_tcp_a_single_host_program_runs_and_tcp_fails_with_the_advice() -> None:
    res = _py(
        """
        import json
        from monarch_core.actor import enable_transport, this_host
        from monarch_core.errors import UnknownTransportError
        from test_plugins import WhereAmI
        pm = this_host().spawn_procs(per_host={"gpus": 2})
        where = pm.spawn("w", WhereAmI).where.call("HOME").get(timeout=60).values()
        pm.stop().get(timeout=30)
        try:
            enable_transport("tcp")
            err = None
        except UnknownTransportError as e:
            err = str(e)
        print(json.dumps({"schemes": sorted({w["address"].split("://")[0] for w in where}), "tcp": err}))
        """,
        MONARCH_DISABLED_PLUGINS="transport_tcp",
    )
    out = _json(res)
    assert out["schemes"] == ["ipc"]
    assert out["tcp"] is not None
    assert "provided by monarch-transport-tcp, which is installed but disabled" in out["tcp"]


# ---------------------------------------------------------------- a broken plugin


def test_broken_plugin_becomes_a_runtime_warning_naming_it_and_the_rest_still_works(tmp_path: pathlib.Path) -> None:
    make_dist(tmp_path, "monarch-broken", "0.7", {"broken": "broken_mod"}, {"broken_mod": BROKEN_MOD})
    res = _py(
        """
        import json, warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from monarch_core._plugins import registry
            reg = registry()
        from monarch_core.actor import this_host
        from test_plugins import WhereAmI
        pm = this_host().spawn_procs(per_host={"gpus": 2})
        where = pm.spawn("w", WhereAmI).where.call("HOME").get(timeout=60).values()
        pm.stop().get(timeout=30)
        print(json.dumps({
            "warnings": [[w.category.__name__, str(w.message)] for w in caught],
            "failed": reg.failed,
            "plugins": [i.name for i in reg.infos],
            "ipc": type(reg.transport("ipc")).__name__,
            "local": type(reg.scheduler("local")).__name__,
            "schemes": sorted({w["address"].split("://")[0] for w in where}),
        }))
        """,
        PYTHONPATH=str(tmp_path),
    )
    out = _json(res)
    assert len(out["warnings"]) == 1, out["warnings"]
    category, message = out["warnings"][0]
    assert category == "RuntimeWarning"
    assert message.startswith("monarch plugin 'broken' (from monarch-broken 0.7, entry point 'broken_mod') failed to load")
    assert "ImportError: broken_mod needs libfoo.so.3, which is not installed" in message
    assert "MONARCH_DISABLED_PLUGINS=broken" in message
    assert out["failed"] == {"broken": "ImportError: broken_mod needs libfoo.so.3, which is not installed"}
    assert _mine(out["plugins"]) == ["builtin", "transport_tcp"]
    assert (out["ipc"], out["local"], out["schemes"]) == ("IpcTransport", "LocalScheduler", ["ipc"])


def test_broken_plugin_is_listed_as_failed_by_monarch_plugins_and_silenced_by_disabling(tmp_path: pathlib.Path) -> None:
    make_dist(tmp_path, "monarch-broken", "0.7", {"broken": "broken_mod"}, {"broken_mod": BROKEN_MOD})
    listed = subprocess.run(
        [MONARCH_CLI, "plugins"], capture_output=True, text=True, timeout=60, env=_env(PYTHONPATH=str(tmp_path))
    )
    assert listed.returncode == 0
    assert _lines(listed.stdout) == [
        BUILTIN_LINE,
        f"transport_tcp (monarch-transport-tcp=={TCP_VERSION})  transports: tcp, tls",
        "broken (monarch-broken==0.7)  FAILED TO LOAD: ImportError: broken_mod needs libfoo.so.3, which is not installed",
    ]
    assert listed.stderr.count("monarch plugin 'broken'") == 1, listed.stderr  # the warning reaches the user, once
    silenced = subprocess.run(
        [MONARCH_CLI, "plugins"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(PYTHONPATH=str(tmp_path), MONARCH_DISABLED_PLUGINS="broken"),
    )
    assert silenced.returncode == 0
    assert silenced.stderr == ""
    assert silenced.stdout.splitlines()[-1] == "broken  disabled by MONARCH_DISABLED_PLUGINS"


# ---------------------------------------------------------------- unknown names


def test_unknown_transport_names_list_the_installed_ones() -> None:
    reg = PluginRegistry()
    with pytest.raises(UnknownTransportError) as ei:
        reg.transport("quic")
    assert str(ei.value) == (
        "no installed plugin provides the transport 'quic'. Installed transports: ['inproc', 'ipc', 'tcp', 'tls'] "
        "(URL schemes: ['inproc', 'ipc', 'tcp', 'tls']). Check the spelling, or install the plugin that provides it."
    )
    assert isinstance(ei.value, PluginError) and isinstance(ei.value, ValueError)


def test_rdma_asked_for_as_a_transport_says_it_is_the_data_plane() -> None:
    with pytest.raises(UnknownTransportError) as ei:
        PluginRegistry().transport("rdma")
    assert "Installed transports: ['inproc', 'ipc', 'tcp', 'tls']" in str(ei.value)
    assert "'rdma' is not a transport: RDMA is monarch-core's data plane" in str(ei.value)
    assert str(ei.value).endswith("Enable 'ipc', 'tcp' or 'tls' for messages.")


def test_unknown_transport_of_an_installed_but_older_plugin_says_upgrade(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every name monarch-transport-tcp promises is provided now, so promise one
    # more: the message for a plugin that is installed but too old to have it.
    from monarch_core import _plugins

    monkeypatch.setitem(_plugins.KNOWN_TRANSPORT_PACKAGES, "quic", "monarch-transport-tcp")
    with pytest.raises(UnknownTransportError) as ei:
        PluginRegistry().transport("quic")
    assert str(ei.value) == (
        "no installed plugin provides the transport 'quic'. Installed transports: ['inproc', 'ipc', 'tcp', 'tls'] "
        "(URL schemes: ['inproc', 'ipc', 'tcp', 'tls']). "
        f"'quic' comes from monarch-transport-tcp, but the installed monarch-transport-tcp {TCP_VERSION} does not "
        "provide it; upgrade it: pip install --upgrade . ./plugins/transport_tcp (in a monarch-core checkout)."
    )


def test_every_name_monarch_transport_tcp_promises_is_provided() -> None:
    from monarch_core._plugins import KNOWN_TRANSPORT_PACKAGES

    reg = PluginRegistry()
    promised = sorted(n for n, pkg in KNOWN_TRANSPORT_PACKAGES.items() if pkg == "monarch-transport-tcp")
    assert promised == ["tcp", "tls"]
    assert [reg.transport(n).name for n in promised] == ["tcp", "tls"]


def test_unknown_scheduler_names_list_the_installed_ones() -> None:
    reg = PluginRegistry()
    with pytest.raises(UnknownSchedulerError) as ei:
        reg.scheduler("kubernetes")
    installed = sorted(["local", *OTHER_SCHEDULERS])
    assert str(ei.value) == f"no installed plugin provides the scheduler 'kubernetes'. Installed schedulers: {installed}."
    for name in ("slurm", "ssh"):
        if name in OTHER_SCHEDULERS:
            continue
        with pytest.raises(UnknownSchedulerError) as ei:
            reg.scheduler(name)
        pkg = f"monarch-scheduler-{name}"
        assert str(ei.value) == (
            f"no installed plugin provides the scheduler {name!r}. Installed schedulers: {installed}. "
            f"{name!r} is provided by {pkg}: {install_hint(pkg)}."
        )


# ---------------------------------------------------------------- a third-party plugin


def test_third_party_transport_plugin_is_usable_by_name_and_carries_a_mesh(
    tmp_path: pathlib.Path, request: pytest.FixtureRequest
) -> None:
    site = tmp_path / "site"
    socks = pathlib.Path(os.path.realpath("/tmp")) / f"mc-dirt-{os.getpid()}-{tmp_path.name[-8:]}"
    socks.mkdir()
    request.addfinalizer(lambda: shutil.rmtree(socks, ignore_errors=True))
    make_dist(site, "monarch-transport-dir", "0.3", {"dirt": "dirt_plugin"}, {"dirt_plugin": DIRT_PLUGIN})
    res = _py(
        """
        import json, os
        from monarch_core._plugins import registry
        from monarch_core.actor import enable_transport, this_host
        from test_plugins import WhereAmI
        import dirt_plugin
        reg = registry()
        t = reg.transport("dir")
        enable_transport("dir")
        pm = this_host().spawn_procs(per_host={"gpus": 2})
        w = pm.spawn("w", WhereAmI)
        where = w.where.call("MC_DIRT_RANK").get(timeout=60).values()
        from monarch_core._proc import _state
        client = _state.current().kernel.address
        files = sorted(os.listdir(os.environ["MC_DIRT_DIR"]))
        pm.stop().get(timeout=30)
        print(json.dumps({
            "is_plugin_class": isinstance(t, dirt_plugin.DirTransport),
            "client": client,
            "where": where,
            "files": files,
            "info": [[i.name, i.distribution, i.version, i.transports, i.hooks] for i in reg.describe()],
        }))
        """,
        PYTHONPATH=str(site),
        MC_DIRT_DIR=str(socks),
    )
    out = _json(res)
    assert out["is_plugin_class"] is True
    assert out["client"].startswith(f"dir://{socks}/")
    assert [w["address"].startswith(f"dir://{socks}/") for w in out["where"]] == [True, True]
    assert [w["var"] for w in out["where"]] == ["procs0:0:{'gpus': 0}", "procs0:1:{'gpus': 1}"]
    assert len({w["pid"] for w in out["where"]}) == 2
    # one socket file per kernel: the client and both procs listened through the plugin
    assert out["files"] == sorted(
        [out["client"].rsplit("/", 1)[1]] + [w["address"].rsplit("/", 1)[1] for w in out["where"]]
    )
    assert ["dirt", "monarch-transport-dir", "0.3", ["dir"], ["monarch_proc_env", "monarch_transports"]] in out["info"]


def test_third_party_plugin_is_listed_by_monarch_plugins(tmp_path: pathlib.Path) -> None:
    make_dist(tmp_path, "monarch-transport-dir", "0.3", {"dirt": "dirt_plugin"}, {"dirt_plugin": DIRT_PLUGIN})
    res = subprocess.run(
        [MONARCH_CLI, "plugins"], capture_output=True, text=True, timeout=60, env=_env(PYTHONPATH=str(tmp_path))
    )
    assert res.returncode == 0, res.stderr
    assert _lines(res.stdout) == [
        BUILTIN_LINE,
        "dirt (monarch-transport-dir==0.3)  transports: dir; hooks: monarch_proc_env",
        f"transport_tcp (monarch-transport-tcp=={TCP_VERSION})  transports: tcp, tls",
    ]


# ---------------------------------------------------------------- monarch plugins


EXPECTED_LISTING = [
    BUILTIN_LINE,
    f"transport_tcp (monarch-transport-tcp=={TCP_VERSION})  transports: tcp, tls",
]


@pytest.mark.parametrize(
    "argv", [[MONARCH_CLI, "plugins"], [sys.executable, "-m", "monarch_core.cli", "plugins"]], ids=["script", "module"]
)
def test_monarch_plugins_lists_each_plugin_with_version_and_what_it_provides(argv: list[str]) -> None:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=_env())
    assert res.returncode == 0, res.stderr
    assert _lines(res.stdout) == EXPECTED_LISTING
    assert TELEMETRY_FILES_LINE in res.stdout.splitlines()  # monarch-core's built-in sink plugin
    if RDMA:  # monarch-transport-rdma, when installed
        version = metadata.version("monarch-transport-rdma")
        assert f"transport_rdma (monarch-transport-rdma=={version})  rdma backends: channel, ibverbs, process_vm; hooks: monarch_rdma_api" in res.stdout
    for name, schedulers in OTHERS.items():  # the project's scheduler plugins, when installed
        assert any(line.startswith(f"{name} (") and f"schedulers: {', '.join(schedulers)}" in line
                   for line in res.stdout.splitlines()), res.stdout
    assert res.stderr == ""


def test_monarch_plugins_shows_a_disabled_plugin() -> None:
    res = subprocess.run(
        [MONARCH_CLI, "plugins"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(MONARCH_DISABLED_PLUGINS="transport_tcp"),
    )
    assert res.returncode == 0, res.stderr
    assert _lines(res.stdout) == [
        EXPECTED_LISTING[0],
        "transport_tcp  disabled by MONARCH_DISABLED_PLUGINS",
    ]


def test_monarch_without_a_command_prints_help_and_exits_2() -> None:
    res = subprocess.run([MONARCH_CLI], capture_output=True, text=True, timeout=60, env=_env())
    assert res.returncode == 2
    assert "plugins" in res.stdout and "usage: monarch" in res.stdout


# ---------------------------------------------------------------- handing the plugin list to a fork server


def test_registry_from_a_resolved_list_matches_the_scanned_one() -> None:
    scanned = PluginRegistry()
    handed = PluginRegistry(resolved=scanned.resolved())
    assert [(i.name, i.distribution, i.version) for i in handed.infos] == [
        (i.name, i.distribution, i.version) for i in scanned.infos
    ]
    assert sorted(handed.transport_specs()) == sorted(scanned.transport_specs())
    assert sorted(handed.scheduler_specs()) == sorted(scanned.scheduler_specs())
    assert handed.transport("ipc").name == scanned.transport("ipc").name
    core_version, eps = scanned.resolved()
    assert core_version == CORE_VERSION
    assert ("transport_tcp", "monarch_transport_tcp.plugin", "monarch-transport-tcp", TCP_VERSION) in eps


def test_adopting_a_list_is_refused_when_a_registry_exists_and_falls_back_on_a_broken_entry() -> None:
    code = textwrap.dedent(
        """
        import sys
        from monarch_core import _plugins
        good = _plugins.PluginRegistry().resolved()
        # a fresh process: the list is adopted, and importlib.metadata is not needed for it
        assert _plugins.adopt_registry(good) is True
        assert _plugins.adopt_registry(good) is False          # one exists already
        assert _plugins.registry().transport("ipc").name
        _plugins.reset_registry()
        core, eps = good
        broken = (core, [*eps, ("ghost", "no_such_module_xyz:plugin", "ghost-dist", "1.0")])
        assert _plugins.adopt_registry(broken) is False       # a listed plugin cannot load
        reg = _plugins.registry()                               # ... so the normal scan runs
        assert "ghost" not in {i.name for i in reg.infos}
        assert reg.transport("ipc").name
        print("OK")
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr


# ---------------------------------------------------------------- plugins that load but do not work
#
# Each is a real throwaway distribution (``make_dist``) found through
# ``PYTHONPATH`` by a child interpreter: the real ``monarch plugins`` CLI, the
# real ``hosts_from_config`` and the real telemetry thread run against it.

RAISING_SCHEDULERS = """
from monarch_core.hookspecs import hookimpl

@hookimpl
def monarch_schedulers():
    raise RuntimeError("cannot reach the cluster's API at 10.0.0.9")
"""

MISSPELLED_HOOK = """
from monarch_core.hookspecs import SchedulerSpec, hookimpl

@hookimpl
def monarch_schedulerz():
    return [SchedulerSpec("typo", "typo_mod:Nothing")]
"""

MISSING_FACTORY_MODULE = """
from monarch_core.hookspecs import TransportSpec, hookimpl

@hookimpl
def monarch_transports():
    return [TransportSpec(name="quux", schemes=("quux",), factory="quux_wire.transport:QuuxTransport")]
"""

RAISING_PROC_ENV = """
from monarch_core.hookspecs import hookimpl

@hookimpl
def monarch_proc_env(proc_name, rank, coords):
    raise KeyError("CUDA_VISIBLE_DEVICES")
"""

FAILING_SINK = """
import os
from monarch_core.hookspecs import TelemetrySink, hookimpl

class CollectorSink(TelemetrySink):
    kinds = frozenset({"metric", "lifecycle"})

    def emit(self, events):
        with open(os.environ["MC_SINK_CALLS"], "a") as f:
            f.write("x")
        raise OSError("collector at 10.0.0.9:4317 refused the connection")

    def __repr__(self):
        return "<CollectorSink>"

@hookimpl
def monarch_telemetry_sinks():
    return [CollectorSink()]
"""


def _monarch_plugins(site: pathlib.Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([MONARCH_CLI, "plugins"], capture_output=True, text=True, timeout=60,
                          env=_env(PYTHONPATH=str(site), **env))


def test_a_hook_that_raises_is_listed_as_broken_by_monarch_plugins_which_exits_0(tmp_path: pathlib.Path) -> None:
    make_dist(tmp_path, "monarch-scheduler-k8s", "0.2", {"k8s": "k8s_mod"}, {"k8s_mod": RAISING_SCHEDULERS})
    res = _monarch_plugins(tmp_path)
    assert res.returncode == 0, res.stderr
    problem = "monarch_schedulers() raised RuntimeError: cannot reach the cluster's API at 10.0.0.9"
    assert _lines(res.stdout) == [
        BUILTIN_LINE,
        f"k8s (monarch-scheduler-k8s==0.2)  BROKEN: {problem}",
        f"transport_tcp (monarch-transport-tcp=={TCP_VERSION})  transports: tcp, tls",
    ]
    assert "Traceback" not in res.stderr
    warning = (f"monarch plugin 'k8s' (from monarch-scheduler-k8s 0.2) is broken: {problem}; what it provides "
               "through that hook is not used. Fix or upgrade monarch-scheduler-k8s, or set "
               "MONARCH_DISABLED_PLUGINS=k8s to run without it.")
    assert res.stderr.count(warning) == 1, res.stderr


def test_hosts_from_config_with_the_local_scheduler_works_beside_a_plugin_whose_hook_raises(
    tmp_path: pathlib.Path,
) -> None:
    site = tmp_path / "site"
    make_dist(site, "monarch-scheduler-k8s", "0.2", {"k8s": "k8s_mod"}, {"k8s_mod": RAISING_SCHEDULERS})
    (tmp_path / "monarch.toml").write_text('[hosts.dev]\nscheduler = "local"\nhosts = 1\n'
                                           '[hosts.cluster]\nscheduler = "k8s"\n')
    res = _py(
        """
        import json, warnings
        warnings.simplefilter("ignore")
        from monarch_core.actor import hosts_from_config
        from monarch_core.errors import ConfigError
        from test_plugins import WhereAmI
        hm = hosts_from_config("dev", timeout=60)
        pm = hm.spawn_procs(per_host={"gpus": 1})
        where = pm.spawn("w", WhereAmI).where.call("HOME").get(timeout=60).values()
        pm.stop().get(timeout=30)
        hm.shutdown().get(timeout=30)
        try:
            hosts_from_config("cluster", timeout=60)
            err = None
        except ConfigError as e:
            err = str(e)
        print(json.dumps({"procs": len(where), "cluster": err}))
        """,
        PYTHONPATH=str(site),
        MONARCH_CONFIG=str(tmp_path / "monarch.toml"),
    )
    out = _json(res)
    assert out["procs"] == 1
    # the mesh that needs the broken plugin's scheduler fails, naming the culprit
    assert "uses scheduler 'k8s', which is not installed" in out["cluster"]
    assert ("'k8s' (from monarch-scheduler-k8s 0.2) is broken: monarch_schedulers() raised RuntimeError: "
            "cannot reach the cluster's API at 10.0.0.9") in out["cluster"]


def test_a_misspelled_hook_fails_the_plugin_naming_the_spec_it_could_have_meant(tmp_path: pathlib.Path) -> None:
    make_dist(tmp_path, "monarch-typo", "0.1", {"typo": "typo_mod"}, {"typo_mod": MISSPELLED_HOOK})
    res = _monarch_plugins(tmp_path)
    assert res.returncode == 0, res.stderr
    why = ("unknown hook 'monarch_schedulerz' (did you mean 'monarch_schedulers'? The hooks are specified in "
           "monarch_core.hookspecs)")
    assert _lines(res.stdout)[-1] == f"typo (monarch-typo==0.1)  FAILED TO LOAD: {why}"
    assert res.stderr.count(f"failed to load and is disabled: {why}. Fix or upgrade it") == 1, res.stderr
    checked = _py(
        """
        import json, warnings
        warnings.simplefilter("ignore")
        from monarch_core._plugins import registry
        reg = registry()
        print(json.dumps({"registered": reg.pm.get_plugin("typo") is not None, "failed": reg.failed.get("typo"),
                          "schedulers": sorted(reg.scheduler_specs())}))
        """,
        PYTHONPATH=str(tmp_path),
    )
    out = _json(checked)
    assert out["registered"] is False and out["failed"] == why
    assert "local" in out["schedulers"] and "typo" not in out["schedulers"]


def test_a_transport_factory_naming_a_missing_module_names_the_plugin_the_module_and_the_fix(
    tmp_path: pathlib.Path,
) -> None:
    make_dist(tmp_path, "monarch-transport-quux", "1.4", {"quux": "quux_mod"}, {"quux_mod": MISSING_FACTORY_MODULE})
    res = _py(
        """
        import json
        from monarch_core._plugins import registry
        from monarch_core.actor import enable_transport
        from monarch_core.errors import PluginError
        try:
            enable_transport("quux")
            err = None
        except PluginError as e:
            err = [str(e), type(e.__cause__).__name__]
        print(json.dumps({"err": err, "ipc": registry().transport("ipc").name}))
        """,
        PYTHONPATH=str(tmp_path),
    )
    out = _json(res)
    assert out["ipc"] == "ipc"
    assert out["err"] == [
        "the transport 'quux' of plugin 'quux' (from monarch-transport-quux 1.4): its factory "
        "'quux_wire.transport:QuuxTransport' needs the module 'quux_wire', which is not installed; install the "
        "distribution that provides the module 'quux_wire' (a dependency of monarch-transport-quux), or reinstall "
        "monarch-transport-quux with its dependencies. Or set MONARCH_DISABLED_PLUGINS=quux to run without it.",
        "ModuleNotFoundError",
    ]


def test_a_project_plugin_whose_factory_module_is_missing_is_told_how_to_reinstall_it() -> None:
    from monarch_core import hookspecs
    from monarch_core._plugins import PluginInfo

    reg = PluginRegistry(load_entry_points=False)
    info = PluginInfo("transport_tcp", "monarch-transport-tcp", TCP_VERSION, module=None)
    spec = hookspecs.TransportSpec(name="tcp", schemes=("tcp",), factory="no_such_module_xyz:Tcp")
    reg._providers["transport:tcp"] = info
    with pytest.raises(PluginError) as ei:
        reg._load(spec, "transport")
    assert str(ei.value) == (
        f"the transport 'tcp' of plugin 'transport_tcp' (from monarch-transport-tcp {TCP_VERSION}): its factory "
        "'no_such_module_xyz:Tcp' needs the module 'no_such_module_xyz', which is not installed; reinstall "
        "monarch-transport-tcp with its dependencies: pip install . ./plugins/transport_tcp (in a monarch-core "
        "checkout). Or set MONARCH_DISABLED_PLUGINS=transport_tcp to run without it."
    )


def test_a_proc_env_hook_that_raises_fails_the_spawn_naming_the_plugin(tmp_path: pathlib.Path) -> None:
    make_dist(tmp_path, "monarch-envr", "0.1", {"envr": "envr_mod"}, {"envr_mod": RAISING_PROC_ENV})
    res = _py(
        """
        import json
        from monarch_core.actor import this_host
        pm = this_host().spawn_procs(per_host={"gpus": 1})
        try:
            pm.initialized.get(timeout=60)
            err = None
        except Exception as e:
            err = [type(e).__name__, str(e)]
        print(json.dumps(err))
        """,
        PYTHONPATH=str(tmp_path),
    )
    kind, message = _json(res)
    assert kind == "SupervisionError"
    assert ("PluginError: plugin 'envr' (from monarch-envr 0.1) failed in its hook monarch_proc_env(): "
            "KeyError: 'CUDA_VISIBLE_DEVICES'. Fix or upgrade monarch-envr, or set MONARCH_DISABLED_PLUGINS=envr "
            "to run without it.") in message


def test_a_plugin_sink_whose_emit_raises_is_one_warning_naming_its_plugin_without_a_traceback(
    tmp_path: pathlib.Path,
) -> None:
    site = tmp_path / "site"
    calls = tmp_path / "calls"
    make_dist(site, "monarch-telemetry-collector", "2.0", {"collector": "collector_mod"},
              {"collector_mod": FAILING_SINK})
    res = _py(
        """
        import os
        from monarch_core.actor import Actor, endpoint, this_host
        from test_plugins import WhereAmI
        pm = this_host().spawn_procs(per_host={"gpus": 1})
        w = pm.spawn("w", WhereAmI)
        # until the sink has failed several times (each telemetry interval, 0.05 s here)
        for _ in range(2000):
            w.where.call("HOME").get(timeout=60)
            if os.path.exists(os.environ["MC_SINK_CALLS"]) and os.path.getsize(os.environ["MC_SINK_CALLS"]) >= 5:
                break
        pm.stop().get(timeout=30)
        print("done")
        """,
        PYTHONPATH=str(site),
        MC_SINK_CALLS=str(calls),
        MONARCH_TELEMETRY_INTERVAL="0.05",
    )
    assert res.returncode == 0 and "done" in res.stdout, res.stderr[-4000:]
    assert calls.read_text().count("x") >= 5  # it failed again and again ...
    warning = ("telemetry sink <CollectorSink> of plugin 'collector' (from monarch-telemetry-collector 2.0) failed "
               "in emit(): OSError: collector at 10.0.0.9:4317 refused the connection; its events are dropped while "
               "it fails (logged at most once every 60s; DEBUG shows the tracebacks). Fix or upgrade "
               "monarch-telemetry-collector, or set MONARCH_DISABLED_PLUGINS=collector to run without it.")
    assert res.stderr.count(warning) == 1, res.stderr[-4000:]  # ... and said so once
    assert "Traceback" not in res.stderr, res.stderr[-4000:]


def test_a_broken_plugin_is_warned_about_once_per_process(tmp_path: pathlib.Path) -> None:
    make_dist(tmp_path, "monarch-broken", "0.7", {"broken": "broken_mod"}, {"broken_mod": BROKEN_MOD})
    make_dist(tmp_path, "monarch-scheduler-k8s", "0.2", {"k8s": "k8s_mod"}, {"k8s_mod": RAISING_SCHEDULERS})
    res = _py(
        """
        from monarch_core import _plugins
        for _ in range(3):  # the registry rebuilt, and others built beside it
            _plugins.reset_registry()
            _plugins.registry().scheduler_specs()
            _plugins.PluginRegistry().describe()
        print("done")
        """,
        PYTHONPATH=str(tmp_path),
    )
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("monarch plugin 'broken'") == 1, res.stderr
    assert res.stderr.count("monarch plugin 'k8s'") == 1, res.stderr


def test_a_describing_hook_returning_the_wrong_things_is_broken_and_the_good_specs_are_kept() -> None:
    import types
    import warnings

    from monarch_core.hookspecs import TransportSpec, hookimpl

    mod = types.ModuleType("wrong_specs_plugin")

    @hookimpl
    def monarch_transports():  # type: ignore[no-untyped-def]
        return [TransportSpec(name="good", schemes=("good",), factory=InprocTransport), "bad"]

    @hookimpl
    def monarch_telemetry_sinks():  # type: ignore[no-untyped-def]
        return [object()]

    mod.monarch_transports = monarch_transports  # type: ignore[attr-defined]
    mod.monarch_telemetry_sinks = monarch_telemetry_sinks  # type: ignore[attr-defined]
    reg = PluginRegistry(load_entry_points=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reg._register("wrong", mod, "monarch-wrong", "0.1")
        assert reg.transport("good").name == "good"
        assert reg.pm.hook.monarch_telemetry_sinks() == [[]]
    info = next(i for i in reg.infos if i.name == "wrong")
    assert info.transports == ["good"]
    assert info.problems == [
        "monarch_transports() returned 'bad', not a TransportSpec",
        "monarch_telemetry_sinks() returned <object object at " + info.problems[1].split(" at ", 1)[1],
    ]
    assert info.problems[1].endswith(", which has no emit(events) method")
    assert [str(w.message).split(":", 1)[0] for w in caught] == [
        "monarch plugin 'wrong' (from monarch-wrong 0.1) is broken"
    ] * 2


LIFECYCLE_PLUGIN = '''
import json, os
from monarch_core.hookspecs import hookimpl

def _log(*a):
    with open(os.environ["LIFECYCLE_LOG"], "a") as f:
        f.write(json.dumps([os.getpid(), *a]) + "\\n")

@hookimpl
def monarch_proc_setup(proc_name, rank):
    _log("setup", rank)

@hookimpl
def monarch_endpoint_raised(exc):
    _log("raised", type(exc).__name__, str(exc))

@hookimpl
def monarch_actor_stopped(actor_key, actor_name, why):
    _log("actor_stopped", actor_name, why)

@hookimpl
def monarch_proc_stopping(why):
    _log("stopping", why)

@hookimpl
def monarch_proc_stopped(why):
    _log("stopped", why)
'''

RAISING_LIFECYCLE = '''
from monarch_core.hookspecs import hookimpl

@hookimpl
def monarch_actor_stopped(actor_key, actor_name, why):
    raise RuntimeError("lifecycle listener broke")
'''


def test_lifecycle_hooks_reach_a_third_party_plugin_in_every_proc_in_order(tmp_path: pathlib.Path) -> None:
    """proc set up, endpoint raised, actor stopped, proc stopping/stopped: in
    each proc, in that order, beside a plugin whose listener raises (logged,
    the stop goes on); the client's own stop is announced too."""
    make_dist(tmp_path, "monarch-lifelog", "0.1", {"lifelog": "lifelog_mod"}, {"lifelog_mod": LIFECYCLE_PLUGIN})
    make_dist(tmp_path, "monarch-lifebad", "0.1", {"lifebad": "lifebad_mod"}, {"lifebad_mod": RAISING_LIFECYCLE})
    log = tmp_path / "events.jsonl"
    res = _py(
        f"""
        import json, os
        from monarch_core.actor import Actor, endpoint, shutdown_context, this_host
        sys.path.insert(0, {str(HERE)!r})

        class Boom(Actor):
            @endpoint
            def boom(self) -> None:
                raise ValueError("boom " + str(os.getpid()))

            @endpoint
            def pid(self) -> int:
                return os.getpid()

        pm = this_host().spawn_procs(per_host={{"gpus": 2}})
        am = pm.spawn("boomers", Boom)
        pids = sorted(am.pid.call().get(timeout=60).values())
        for rank in range(2):
            try:
                am.slice(gpus=rank).boom.call_one().get(timeout=60)
            except Exception as e:
                pass
        am.stop("done with it").get(timeout=60)
        pm.stop().get(timeout=60)
        shutdown_context().get()
        print(json.dumps({{"pids": pids, "client": os.getpid()}}))
        """,
        PYTHONPATH=str(tmp_path), LIFECYCLE_LOG=str(log),
    )
    out = _json(res)
    events: dict[int, list] = {}
    for line in log.read_text().splitlines():
        pid, *ev = json.loads(line)
        events.setdefault(pid, []).append(ev)
    for pid in out["pids"]:
        kinds = [e[0] for e in events[pid]]
        assert kinds == ["setup", "raised", "actor_stopped", "stopping", "stopped"], events[pid]
        raised, stopped = events[pid][1], events[pid][2]
        assert raised == ["raised", "ValueError", f"boom {pid}"]
        assert stopped[1].startswith("boomers") and "done with it" in stopped[2]
    assert [e[0] for e in events[out["client"]]] == ["stopping", "stopped"]
    assert "the actor_stopped listener lifebad raised" in res.stderr
    assert "RuntimeError: lifecycle listener broke" in res.stderr
