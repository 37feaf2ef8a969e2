"""Endpoint metrics: exact counts, errors by type and bytes for a known
sequence of calls, on both sides, per rank; ``instrument=False``; shipped in
batches (never a message per call); the histogram's percentiles."""

from __future__ import annotations

import asyncio
import random

import pytest

from monarch_core import telemetry
from monarch_core._proc import _serial
from monarch_core._telemetry import _hub, _metrics
from monarch_core.actor import Actor, ActorError, endpoint


class Calc(Actor):
    @endpoint
    def add(self, a: int, b: int) -> int:
        return a + b

    @endpoint
    def fail(self, kind: str) -> None:
        raise {"value": ValueError, "key": KeyError}[kind](kind)

    @endpoint(instrument=False)
    def hidden(self) -> int:
        return 1

    @endpoint
    async def blob(self, n: int) -> bytes:
        await asyncio.sleep(0)
        return b"y" * n


def size(obj: object) -> int:
    payload, bufs = _serial.dumps(obj)
    return len(payload) + sum(memoryview(b).nbytes for b in bufs)


def rows(mesh: str, **kw: object) -> dict[tuple, telemetry.EndpointMetrics]:
    out = {}
    for r in telemetry.endpoint_metrics(mesh=mesh, **kw):
        key = (r.side, r.endpoint, r.rank, r.adverb)
        assert key not in out, f"two rows for {key}"
        out[key] = r
    return out


def test_counts_errors_and_bytes_of_a_known_sequence_are_exact(procs) -> None:
    mesh = procs.spawn("metrics_calc", Calc)
    one = mesh.slice(gpus=1)
    for i in range(5):
        assert one.add.call_one(i, 1).get() == i + 1
    for kind in ["value", "value", "key", "value", "key"]:
        with pytest.raises(ActorError):
            one.fail.call_one(kind).get()
    assert mesh.add.call(1, 2).get().values() == [3, 3]
    assert mesh.hidden.call().get().values() == [1, 1]
    mesh.add.broadcast(0, 0)
    big = 100_000
    assert len(one.blob.call_one(big).get()) == big
    assert mesh.add.call(0, 0).get().values() == [0, 0]  # the broadcast was handled before this

    got = rows("metrics_calc")
    req = [size(((i, 1), {})) for i in range(5)]
    c = got[("client", "add", 1, "call_one")]
    assert (c.calls, c.error_count, c.latency.count) == (5, 0, 5)
    assert c.request_bytes == sum(req) and c.reply_bytes == sum(size(i + 1) for i in range(5))
    assert c.proc == got[("client", "add", None, "call")].proc  # measured in this process

    f = got[("client", "fail", 1, "call_one")]
    assert (f.calls, dict(f.errors)) == (5, {"ActorError": 5}), "the caller sees ActorError"
    sf = got[("server", "fail", 1, "")]
    assert (sf.calls, dict(sf.errors)) == (5, {"ValueError": 3, "KeyError": 2}), "the server sees what was raised"
    assert sf.request_bytes == sum(size(((k,), {})) for k in ["value", "value", "key", "value", "key"])

    call = got[("client", "add", None, "call")]
    assert (call.calls, call.latency.count) == (2, 2)
    assert call.request_bytes == 2 * (size(((1, 2), {})) + size(((0, 0), {})))  # once per actor reached
    assert call.reply_bytes == 2 * (size(3) + size(0))
    b = got[("client", "add", None, "broadcast")]
    assert (b.calls, b.latency.count, b.reply_bytes) == (1, 0, 0)
    assert b.request_bytes == 2 * size(((0, 0), {}))

    s1 = got[("server", "add", 1, "")]
    s0 = got[("server", "add", 0, "")]
    assert (s1.calls, s0.calls) == (5 + 3, 3)  # call_one x5, call x2, broadcast, on rank 1
    assert s1.request_bytes == sum(req) + size(((1, 2), {})) + 2 * size(((0, 0), {}))
    assert s1.reply_bytes == sum(size(i + 1) for i in range(5)) + size(3) + size(0)  # a broadcast has no reply
    assert s1.proc != c.proc and s1.proc == sf.proc  # the server side: in the actor's proc
    assert s0.host and s1.host

    blob_c, blob_s = got[("client", "blob", 1, "call_one")], got[("server", "blob", 1, "")]
    assert blob_c.reply_bytes == blob_s.reply_bytes == size(b"y" * big)
    assert blob_s.latency.count == 1

    assert not [k for k in got if k[1] == "hidden"], "instrument=False records nothing"
    for r in got.values():
        if r.latency.count:
            lat = r.latency
            assert 0 < lat.min_ns <= lat.percentile(50) <= lat.percentile(99) <= lat.max_ns
            assert r.p50_ms == lat.percentile(50) / 1e6

    merged = {(r.side, r.endpoint): r for r in telemetry.endpoint_metrics(mesh="metrics_calc", per_rank=False)}
    assert merged[("server", "add")].calls == 11
    assert merged[("client", "add")].calls == 8
    table = telemetry.metrics_table(top=0, refresh=False)
    assert "metrics_calc.fail" in table and "ValueError 3" in table and "ActorError 5" in table
    mesh.stop().get(timeout=30)


def test_metrics_travel_in_batches_not_a_message_per_call(procs, monkeypatch: pytest.MonkeyPatch) -> None:
    mesh = procs.spawn("metrics_batches", Calc)
    one = mesh.slice(gpus=0)
    one.add.call_one(0, 0).get()
    telemetry.flush()
    seen: list[dict] = []
    real = _hub.hub.ingest
    monkeypatch.setattr(_hub.hub, "ingest", lambda batch: (seen.append(batch), real(batch))[1])
    n = 3000
    futs = [one.add.call_one(i, 0) for i in range(n)]
    assert [f.get() for f in futs] == list(range(n))
    telemetry.flush()
    server = [r for r in telemetry.endpoint_metrics(mesh="metrics_batches", side="server", refresh=False)]
    assert sum(r.calls for r in server) == n + 1
    with_metrics = [b for b in seen if b.get("metrics")]
    assert 1 <= len(with_metrics) <= 10, f"{len(with_metrics)} batches for {n} calls"
    mesh.stop().get(timeout=30)


def test_histogram_percentiles_are_within_a_bucket() -> None:
    rng = random.Random(7)
    values = sorted(int(rng.lognormvariate(11, 1.0)) for _ in range(20000))
    st = _metrics.EndpointStat(("server", "k", "m", "e", 0, ""))
    for v in values:
        st.record(v, 0, 0)
    lat = _metrics.from_snapshot(st.snapshot(), "p", "h").latency
    for q in (1, 50, 90, 99, 99.9):
        exact = values[min(len(values) - 1, int(q / 100 * len(values)))]
        assert abs(lat.percentile(q) - exact) <= 0.0625 * exact + 1, (q, lat.percentile(q), exact)
    assert lat.count == len(values) and lat.sum_ns == sum(values)
    assert lat.min_ns == values[0] and lat.max_ns == values[-1]
    for i in range(_metrics.NBUCKETS - 8):
        lo, hi = _metrics.bucket_bounds(i)
        assert _metrics.bucket_of(lo) == i and _metrics.bucket_of(hi - 1) == i and _metrics.bucket_of(hi) == i + 1


def test_telemetry_off_records_nothing(client_script) -> None:
    out = client_script(
        """
        import json
        from monarch_core import telemetry
        from monarch_core.actor import Actor, endpoint, this_host

        class A(Actor):
            @endpoint
            def f(self) -> int:
                return 1

        pm = this_host().spawn_procs({"gpus": 2})
        m = pm.spawn("off", A)
        m.f.call().get()
        m.slice(gpus=0).f.call_one().get()
        print(json.dumps(len(telemetry.endpoint_metrics())))
        pm.stop().get()
        """,
        env={"MONARCH_TELEMETRY": "0"},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "0"


def test_bad_arguments_are_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="'client' or 'server'"):
        telemetry.endpoint_metrics(side="callee", refresh=False)
    with pytest.raises(ValueError, match="seconds >= 0"):
        telemetry.flush(timeout=-1)
    with pytest.raises(TypeError, match="emit"):
        telemetry.add_sink(object())


class Peeker(Actor):
    @endpoint
    def peek(self) -> int:
        # an actor may read its own process's metrics; that must not keep them from the client
        return sum(r.calls for r in telemetry.endpoint_metrics(endpoint="peek", side="server"))


def test_an_actor_reading_metrics_does_not_take_them_from_the_client(procs, tmp_path) -> None:
    import json

    m = procs.spawn("metrics_peek", Peeker).slice(gpus=0)
    path = tmp_path / "peek.json"
    with telemetry.record_trace(str(path)):
        assert m.peek.call_one().get() == 0  # its own call is recorded once it has returned
        assert m.peek.call_one().get() == 1  # (this flush in the proc must ship the first call's span)
        assert m.peek.call_one().get() == 2
    server = telemetry.endpoint_metrics(mesh="metrics_peek", side="server")
    assert [(r.endpoint, r.calls) for r in server] == [("peek", 3)]
    spans = [e for e in json.loads(path.read_text()) if e["ph"] == "X" and e["name"] == "metrics_peek.peek"]
    assert sorted(e["cat"] for e in spans) == ["client"] * 3 + ["server"] * 3


class Folded(Actor):
    """(a class of its own: stopped meshes are folded per class, and other tests stop ``Calc`` meshes)"""

    @endpoint
    def add(self, a: int, b: int) -> int:
        return a + b


def test_a_stopped_mesh_leaves_its_totals_by_the_documented_rule(procs, monkeypatch: pytest.MonkeyPatch) -> None:
    # docs/observability.md, "Stopped meshes": nothing of a stopped mesh stays live in any
    # process; the client keeps the last MONARCH_METRICS_KEEP_STOPPED meshes' rows as they were
    # and folds older ones into one row per (side, class, endpoint), so the totals stay.
    # With keep=1 any other mesh that stops meanwhile displaces ours: earlier tests' procs in this
    # worker end on their own schedule and their meshes' rows arrive as stopped ones.  So the
    # record under test is a fresh one that hears only of this test's meshes (the rule is the same).
    keys: list[str] = []

    class Ours(_metrics.Stopped):
        def add(self, mesh_key: str, rows: list[tuple]) -> None:
            if mesh_key in keys:
                super().add(mesh_key, rows)

    ours = Ours()
    ours.keep = 1
    monkeypatch.setattr(_metrics, "stopped", ours)
    for round_ in range(3):
        mesh = procs.spawn("metrics_fold", Folded)
        keys.append(mesh._key)
        one = mesh.slice(gpus=1)
        assert one.add.call_one(round_, 1).get() == round_ + 1
        assert mesh.add.call(0, 0).get().values() == [0, 0]
        mesh.stop().get(timeout=30)
    telemetry.flush()
    assert not [k for k in _metrics._stats if k[1] in keys], "client-side stats of stopped meshes kept live"
    assert not [k for k in _metrics._remote if k[1][1] in keys], "server-side stats of stopped meshes kept live"
    rows = telemetry.endpoint_metrics(mesh="metrics_fold", endpoint="add")
    kept = [r for r in rows if r.mesh_key == keys[-1]]
    folded = [r for r in rows if r.mesh_key == "*"]
    assert {(r.side, r.rank, r.adverb) for r in kept} == {
        ("client", 1, "call_one"), ("client", None, "call"), ("server", 0, ""), ("server", 1, "")}
    assert len(folded) == 2 and {r.side for r in folded} == {"client", "server"}, folded
    fc = next(r for r in folded if r.side == "client")
    fs = next(r for r in folded if r.side == "server")
    assert (fc.calls, fc.rank, fc.adverb) == (4, None, "*")  # two meshes: call_one + call each
    assert fs.calls == 6 and fs.proc == "*"  # two meshes: 1 + 2 calls on the server side each
    merged = {r.side: r for r in telemetry.endpoint_metrics(mesh="metrics_fold", endpoint="add", per_rank=False,
                                                            refresh=False)}
    assert (merged["client"].calls, merged["server"].calls) == (6, 9), "the run's totals stay"


def test_folding_keeps_the_name_only_when_the_meshes_shared_it() -> None:
    st = _metrics.Stopped()
    st.keep = 0
    for i, name in enumerate(["a", "a", "b"]):
        s = _metrics.EndpointStat(("server", f"k{i}", name, "e", 0, ""))
        s.record(1000, 1, 2)
        st.add(f"k{i}", [(s.snapshot(), "p", "h", "C")])
        if i == 1:
            (row,) = st.rows()
            assert (row.mesh, row.calls, row.mesh_key) == ("a", 2, "*")
    (row,) = st.rows()
    assert (row.mesh, row.calls, row.request_bytes, row.reply_bytes, row.latency.count) == ("*", 3, 3, 6, 3)
    assert not st.meshes
