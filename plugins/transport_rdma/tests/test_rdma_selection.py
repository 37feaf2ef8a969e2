"""How backends are chosen: the preference order, the forcing setting, the
fallback (and its one warning), resolution once per owner proc, never a
pluggy call per transfer; the API's names; CUDA where a GPU exists."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import monarch_core.rdma as rdma
from monarch_transport_rdma._buffers import _backends
from monarch_core.errors import ConfigError, RDMAError
from monarch_core.rdma import RDMABuffer, get_rdma_backend, is_ibverbs_available, is_rdma_available

from rdma_actors import pattern

needs_plugin = pytest.mark.skipif(
    not _backends.load().known or "process_vm" not in _backends.load().known,
    reason="monarch-transport-rdma is not installed (pip install ./plugins/transport_rdma)",
)


def test_the_api_has_the_reference_names() -> None:
    assert set(rdma.__all__) == {"RDMAAction", "RDMABuffer", "RDMAError", "RDMATcpFallbackWarning",
                                 "get_rdma_backend", "is_ibverbs_available", "is_rdma_available"}
    assert issubclass(rdma.RDMATcpFallbackWarning, Warning)


def test_importing_the_rdma_api_loads_no_kernel_machinery_and_no_backend() -> None:
    code = ("import sys, monarch_core.rdma; print(sorted(m for m in ('trio', 'asyncio', 'pluggy', "
            "'monarch_core.hookspecs', 'monarch_transport_rdma', 'pyverbs', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@needs_plugin
def test_the_preference_order_and_what_is_available_here() -> None:
    got = _backends.load()
    assert got.known == ["ibverbs", "process_vm", "channel"]  # highest preference first
    assert [b.name for b in got.backends][-2:] == ["process_vm", "channel"]
    if not is_ibverbs_available():  # no RDMA device on the project's machines
        assert get_rdma_backend() == "process_vm"
        why = got.unavailable["ibverbs"]
        assert "pyverbs is not installed" in why or "no RDMA device" in why
    with pytest.warns(DeprecationWarning, match="is_ibverbs_available"):
        assert is_rdma_available() == is_ibverbs_available()


def test_the_setting_forces_a_backend_and_names_the_known_ones(owner, monkeypatch) -> None:
    buf = owner.make.call_one("bytearray", 1000, 1).get(timeout=60)
    monkeypatch.setenv("MONARCH_RDMA_BACKEND", "channel")
    assert get_rdma_backend() == "channel" and buf.backend == "channel"
    monkeypatch.setenv("MONARCH_RDMA_BACKEND", "carrier-pigeon")
    with pytest.raises(ConfigError) as e:
        buf.read_into(bytearray(1000)).get(timeout=60)
    assert "MONARCH_RDMA_BACKEND='carrier-pigeon'" in str(e.value) and "known: auto, " in str(e.value)
    assert "channel" in str(e.value)


@needs_plugin
def test_forcing_a_backend_that_cannot_work_here_says_why(owner, monkeypatch) -> None:
    if is_ibverbs_available():
        pytest.skip("this machine has an RDMA device")
    buf = owner.make.call_one("bytearray", 1000, 2).get(timeout=60)
    monkeypatch.setenv("MONARCH_RDMA_BACKEND", "ibverbs")
    with pytest.raises(RDMAError) as e:
        buf.read_into(bytearray(1000)).get(timeout=60)
    assert "MONARCH_RDMA_BACKEND=ibverbs" in str(e.value) and _backends.load().unavailable["ibverbs"] in str(e.value)


@needs_plugin
def test_auto_takes_process_vm_on_one_host(owner, monkeypatch) -> None:
    monkeypatch.delenv("MONARCH_RDMA_BACKEND", raising=False)
    buf = owner.make.call_one("bytearray", 1 << 20, 3).get(timeout=60)
    assert buf.backend == ("ibverbs" if is_ibverbs_available() else "process_vm")


@needs_plugin
def test_each_owner_proc_is_connected_once_and_no_hook_runs_per_transfer(meshes, monkeypatch) -> None:
    import pluggy._hooks

    from monarch_core.actor import this_host

    from rdma_actors import Owner

    monkeypatch.delenv("MONARCH_RDMA_BACKEND", raising=False)
    procs = this_host().spawn_procs(per_host={"procs": 1}, name="rdma_once")
    meshes.append(procs)
    o = procs.spawn("once", Owner)
    backend = _backends.load().by_name["process_vm"]
    calls = []
    real = backend.connect
    monkeypatch.setattr(backend, "connect", lambda peer, ex: calls.append(peer.proc_id) or real(peer, ex))
    bufs = [o.make.call_one("bytearray", 4096, 10 + i).get(timeout=60) for i in range(3)]
    hooks: list = []
    real_call = pluggy._hooks.HookCaller.__call__
    monkeypatch.setattr(pluggy._hooks.HookCaller, "__call__", lambda self, **kw: hooks.append(self.name) or real_call(self, **kw))
    for b in bufs * 3:
        b.read_into(bytearray(4096)).get(timeout=60)
        b.write_from(b"abc").get(timeout=60)
    assert hooks == [], f"pluggy hooks called for transfers: {hooks}"
    assert len(calls) == 1


def test_without_the_plugin_the_api_imports_and_using_it_says_what_to_install(client_script) -> None:
    out = client_script(textwrap.dedent("""
        import monarch_core.rdma as rdma
        print("all", sorted(rdma.__all__) == sorted(dir(rdma)))
        try:
            from monarch_core.rdma import RDMABuffer
        except ImportError as e:
            print("error", e)
    """), env={"MONARCH_DISABLED_PLUGINS": "transport_rdma"}, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all True" in out.stdout
    assert "needs a plugin that provides RDMABuffer" in out.stdout and \
        "pip install . ./plugins/transport_rdma" in out.stdout, out.stdout


def test_with_no_other_backend_the_channel_serves_and_warns_once(client_script) -> None:
    out = client_script(textwrap.dedent("""
        import warnings
        from monarch_transport_rdma import _cma
        _cma.ProcessVmBackend.unavailable = lambda self: "turned off by this test"  # this client has no other path
        from monarch_core.actor import this_host
        from monarch_core.rdma import RDMATcpFallbackWarning, get_rdma_backend
        from rdma_actors import Owner, pattern

        print("best", get_rdma_backend())
        procs = this_host().spawn_procs(per_host={"procs": 1})
        o = procs.spawn("o", Owner)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for i in range(2):
                b = o.make.call_one("bytearray", 100000, i).get(timeout=60)
                dst = bytearray(100000)
                b.read_into(dst).get(timeout=60)
                assert dst == pattern(100000, i)
                print("backend", b.backend)
        fallback = [w for w in caught if issubclass(w.category, RDMATcpFallbackWarning)]
        print("warnings", len(fallback))
        print("says", "channel fallback" in str(fallback[0].message), fallback[0].filename.endswith("client.py"))
        procs.stop().get(timeout=30)
    """), path=[_this_folder()], timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "best channel" in out.stdout and out.stdout.count("backend channel") == 2
    assert "warnings 1" in out.stdout and "says True True" in out.stdout


def test_the_hookspec_example_backend_is_used_when_forced(client_script) -> None:
    """The example in ``monarch_rdma_backends``'s docstring, registered and forced."""
    from monarch_core import hookspecs

    doc = hookspecs.monarch_rdma_backends.__doc__
    example = textwrap.dedent(doc.split("a real one reaches other processes)::", 1)[1].split("See ``docs", 1)[0])
    out = client_script(example + textwrap.dedent("""
        import sys
        from monarch_core._plugins import registry
        from monarch_core.rdma import RDMABuffer
        registry().pm.register(sys.modules[__name__], name="same_process")
        src = bytearray(b"x" * 5000)
        b = RDMABuffer(src)
        print("backend", b.backend)
        dst = bytearray(5000)
        b.read_into(dst).get(timeout=30)
        same = dst == src
        b.write_from(b"hello").get(timeout=30)
        print("ok", same, bytes(src[:5]))
    """), env={"MONARCH_RDMA_BACKEND": "same_process"}, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "backend same_process" in out.stdout and "ok True b'hello'" in out.stdout


def _this_folder() -> str:
    import os

    return os.path.dirname(os.path.abspath(__file__))


def test_cuda_tensors(owner, backend) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU on this machine: CUDA tensors (staged through host memory) need one")
    n = 1 << 20
    buf = owner.make.call_one("bytearray", n, 90).get(timeout=60)
    dst = torch.zeros(n, dtype=torch.uint8, device="cuda")
    buf.read_into(dst).get(timeout=60)
    assert bytes(dst.cpu().numpy()) == pattern(n, 90)
    src = torch.full((n,), 7, dtype=torch.uint8, device="cuda")
    buf.write_from(src).get(timeout=60)
    gpu = RDMABuffer(torch.arange(n, dtype=torch.uint8, device="cuda"))
    assert gpu.backend in ("local",)
    host = bytearray(n)
    gpu.read_into(host).get(timeout=60)
    assert host == bytes(torch.arange(n, dtype=torch.uint8).numpy())
