"""Every code example of the transport contract runs: the python blocks of
docs/plugin-authors.md's transport sections and the DirTransport of the
``monarch_transports`` hookspec docstring pass ``check_transport``; the
documented zlib transport with its flush removed makes the kit fail with
its timeout message, not hang."""

from __future__ import annotations

import functools
import re
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest
import trio

import monarch_core.hookspecs as hs
from monarch_core.testing import check_transport

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugin-authors.md"


def _section(title: str, text: str) -> str:
    start = text.index(title)
    nxt = text.find("\n## ", start + len(title))
    return text[start:] if nxt < 0 else text[start:nxt]


def _python_blocks(section: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", section, re.S)


def _module(name: str, code: str, where: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    exec(compile(code, where, "exec"), mod.__dict__)
    return mod


@pytest.fixture
def zlib_plugin(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """The documented zlib transport, importable as zlib_transport.plugin (as its "Test it" imports it)."""

    def install(code: str) -> types.ModuleType:
        mod = _module("zlib_transport.plugin", code, str(DOC))
        pkg = types.ModuleType("zlib_transport")
        pkg.plugin = mod  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "zlib_transport", pkg)
        monkeypatch.setitem(sys.modules, "zlib_transport.plugin", mod)
        return mod

    return install


def _doc_blocks() -> tuple[str, str]:
    text = DOC.read_text()
    transport = _python_blocks(_section("## 3. A transport", text))
    test_it = _python_blocks(_section("## 5. Test it", text))
    assert len(transport) == 1 and len(test_it) == 1, (transport, test_it)
    return transport[0], test_it[0]


def test_every_python_block_of_the_transport_guide_runs_and_the_zlib_transport_passes_the_kit(zlib_plugin) -> None:  # type: ignore[no-untyped-def]
    plugin_code, test_code = _doc_blocks()
    mod = zlib_plugin(plugin_code)
    specs = mod.monarch_transports()
    assert [s.name for s in specs] == ["zlibtcp"] and specs[0].schemes == ("zlibtcp",)
    test = _module("test_zlib_from_docs", test_code, str(DOC))
    test.test_zlibtcp_conforms()  # check_transport, as the guide says


def test_the_kit_fails_with_its_timeout_message_for_a_zlib_stream_that_does_not_flush(zlib_plugin) -> None:  # type: ignore[no-untyped-def]
    plugin_code, _ = _doc_blocks()
    flush = " + self._z.flush(zlib.Z_SYNC_FLUSH)"
    assert flush in plugin_code
    mod = zlib_plugin(plugin_code.replace(flush, ""))
    t0 = time.monotonic()
    with pytest.raises(AssertionError) as ei:
        trio.run(functools.partial(check_transport, mod.ZlibTcpTransport(), "zlibtcp://127.0.0.1:0", timeout=1.0))
    assert time.monotonic() - t0 < 15, "the kit took far longer than its step timeout"
    msg = str(ei.value)
    assert re.search(r": did not finish within [12]s: .*the stream did not deliver .*Z_SYNC_FLUSH", msg), msg
    assert msg.startswith(("three concurrent", "a.send_all(b'ping')")), msg


def test_the_dir_transport_of_the_hookspec_docstring_passes_the_kit_and_leaves_no_socket_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    doc = hs.monarch_transports.__doc__
    assert doc is not None
    block = doc[doc.index("# my_transport/plugin.py"):doc.index("    and in ``pyproject.toml``")]
    mod = _module("my_transport_from_docstring", textwrap.dedent("        " + block), "hookspecs.monarch_transports")
    t = mod.DirTransport()
    trio.run(check_transport, t, f"dir://{tmp_path}/s.sock")
    assert list(tmp_path.iterdir()) == []
    test_block = doc[doc.index("        import trio\n        from monarch_core.testing"):doc.index("    ``docs/plugin-authors.md``")]
    sys.modules["my_transport.plugin"] = mod  # what the docstring's test imports
    sys.modules["my_transport"] = types.ModuleType("my_transport")
    try:
        _module("test_dir_from_docstring", textwrap.dedent(test_block), "hookspecs").test_dir_transport_conforms()
    finally:
        del sys.modules["my_transport.plugin"], sys.modules["my_transport"]


def test_the_testing_module_example_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The example imports ``my_transport.plugin.MyTransport`` (the reader's
    transport): here that is the real built-in ipc transport."""
    import monarch_core.testing as kit
    from monarch_core._builtins._ipc import IpcTransport

    pkg, plugin = types.ModuleType("my_transport"), types.ModuleType("my_transport.plugin")
    plugin.MyTransport = IpcTransport  # type: ignore[attr-defined]
    pkg.plugin = plugin  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "my_transport", pkg)
    monkeypatch.setitem(sys.modules, "my_transport.plugin", plugin)
    doc = kit.__doc__
    assert doc is not None
    block = doc[doc.index("    import trio\n"):doc.index(":func:`check_transport` listens")]
    assert "monarch_core._" not in block, "the example imports a private module"
    _module("kit_example", textwrap.dedent(block), "monarch_core.testing").test_conformance()


def test_a_transport_object_takes_its_spec_name(caplog: pytest.LogCaptureFixture) -> None:
    """A transport class inheriting another's name (a zlibtcp built on the tcp
    class, say) would start procs on the wrong transport: the registry gives it
    the spec's name and says so."""
    from monarch_core._builtins._ipc import IpcTransport
    from monarch_core._plugins import PluginRegistry

    class Mine(IpcTransport):  # name = "ipc", inherited
        pass

    class Plugin:
        @staticmethod
        @hs.hookimpl
        def monarch_transports():  # type: ignore[no-untyped-def]
            return [hs.TransportSpec(name="mine", schemes=("mine",), factory=Mine)]

    reg = PluginRegistry(load_entry_points=False)
    reg._register("mine", Plugin, "test", "0")
    with caplog.at_level("WARNING", logger="monarch"):
        t = reg.transport("mine")
    assert t.name == "mine" and reg.transport("mine") is t
    assert "its object's name is 'ipc'; using 'mine'" in caplog.text
