"""The model the pages are rendered from: what it makes of telemetry events and
of the client's output lines."""

from __future__ import annotations

from monarch_core.hookspecs import TelemetryEvent

from monarch_dashboard import _render
from monarch_dashboard._model import JobModel, coords_rank


def _metric(side: str, rank: int | None, calls: int, proc: str, buckets: dict[str, int], errors: dict | None = None
            ) -> TelemetryEvent:
    n = sum(buckets.values())
    return TelemetryEvent("metric", "endpoint", 1, 0, {
        "side": side, "mesh": "w", "mesh_key": "w-1", "endpoint": "step", "rank": rank, "adverb": "", "proc": proc,
        "calls": calls, "errors": errors or {}, "request_bytes": 10 * calls, "reply_bytes": 5 * calls,
        "latency_count": n, "latency_sum_ns": 1000 * n, "latency_min_ns": 100, "latency_max_ns": 10_000,
        "latency_buckets": buckets})


def test_coordinates_give_the_row_major_rank() -> None:
    assert coords_rank("{'hosts': 0/2, 'procs': 3/4}") == 3
    assert coords_rank("w{'hosts': 1/2, 'procs': 2/4}") == 6
    assert coords_rank("client") is None


def test_output_lines_keep_their_prefix_and_are_filtered_by_mesh_rank_and_level() -> None:
    m = JobModel()
    m.add_output("stdout", ["[w{'hosts': 0/2, 'procs': 3/4} local0] step 1",
                            "[w{'hosts': 1/2, 'procs': 0/4} local1] WARNING: slow [disk] ] here",
                            "[16 similar lines] loss 0.1", "plain client print"])
    lines = m.log_view()
    assert [ln.prefix for ln in lines] == ["[w{'hosts': 0/2, 'procs': 3/4} local0]",
                                           "[w{'hosts': 1/2, 'procs': 0/4} local1]", "[16 similar lines]", "[client]"]
    assert lines[1].text == "WARNING: slow [disk] ] here"
    assert [ln.text for ln in m.log_view(rank=3)] == ["step 1"]
    assert [ln.rank for ln in m.log_view(mesh="w")] == [3, 4]
    assert [ln.text for ln in m.log_view(level="WARNING")] == ["WARNING: slow [disk] ] here"]


def test_endpoint_rows_sum_the_ranks_keep_each_and_merge_histograms() -> None:
    m = JobModel()
    m.ingest([_metric("server", 0, 3, "p0", {"100": 3}), _metric("server", 1, 4, "p1", {"200": 4}, {"ValueError": 1}),
              _metric("client", None, 7, "c", {"210": 7})])
    m.ingest([_metric("server", 0, 5, "p0", {"100": 5})])  # cumulative: supersedes the first figures of p0
    (row,) = m.endpoint_rows()
    assert (row.calls, row.errors, row.count, row.request_bytes) == (9, {"ValueError": 1}, 9, 90)
    assert [(r.rank, r.calls) for r in row.ranks] == [(0, 5), (1, 4)]
    assert row.client_p50_ns is not None and row.p(50) is not None
    svg = _render.histogram_svg(row.buckets)
    assert sum(b["count"] for b in svg["bars"]) == 9


def test_a_killed_proc_and_its_cascade_mark_the_tree() -> None:
    m = JobModel()
    ident = {"proc": "client-1", "proc_name": "client", "host": "vm", "pid": 1}
    ev = [("host_mesh.spawned", {"mesh": "two", "hosts": ["local0"], "scheduler": "local"}),
          ("proc_mesh.spawned", {"mesh": "procs0", "host_mesh": "two", "extent": {"procs": 2}, "hosts": ["local0"]}),
          ("actor_mesh.spawned", {"mesh": "w", "mesh_key": "w-1", "class_name": "W", "proc_mesh": "procs0",
                                  "extent": {"procs": 2}}),
          ("proc.ready", {"mesh": "procs0", "proc_id": "p0", "rank": 0, "coords": "{'procs': 0/2}", "host_name": "local0",
                          "os_pid": 10}),
          ("proc.ready", {"mesh": "procs0", "proc_id": "p1", "rank": 1, "coords": "{'procs': 1/2}", "host_name": "local0",
                          "os_pid": 11}),
          ("actor_mesh.ready", {"mesh": "w", "mesh_key": "w-1"}),
          ("proc.failed", {"mesh": "procs0", "proc_id": "p1", "rank": 1, "host_name": "local0", "exit_code": None,
                           "signal": "SIGKILL", "reason": "killed by SIGKILL"}),
          ("supervision.event", {"mesh": "w", "mesh_key": "w-1", "ranks": ["{'procs': 1/2}"], "category": "infrastructure",
                                 "owner": "unhandled_fault_hook", "chain": [],
                                 "root_cause": {"actor": "w{'procs': 1/2}", "category": "infrastructure",
                                                "cause": "its process died"}})]
    m.ingest([TelemetryEvent("lifecycle", n, i, 0, {**ident, **a}) for i, (n, a) in enumerate(ev)])
    procs = m.tree()[0]["hosts"][0]["proc_meshes"][0]["procs"]
    assert [(p["rank"], p["state"], p["actors"][0]["state"]) for p in procs] == [(0, "running", "running"),
                                                                               (1, "failed", "failed")]
    assert procs[1]["first_failure"] == "w{'procs': 1/2} [infrastructure]: its process died"
    assert [f["name"] for f in m.failure_view()] == ["proc.failed", "supervision.event"]
    html = _render.live(m, "failures", {})
    assert "SIGKILL" in html and "category</span> infrastructure" in html
