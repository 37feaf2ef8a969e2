"""What the dashboard makes of a job's telemetry (issue 41, "the dashboard tells
the story"), at the model and rendering level: exception messages per endpoint
and rank (bounded), failures at the caller, one group per cascade, a rank grid
that keeps a 256-proc job on one screen, a time axis with lanes in rank order,
stragglers by a stated rule, one name per host, log search and timestamps.

The events are synthetic (``synthetic.py``: the shapes the core's telemetry
gives the sink); the browser tests run the same views against real jobs."""

from __future__ import annotations

import re
import time
from markupsafe import escape as html_escape

from synthetic import job, lifecycle, metric, raised

from monarch_dashboard import _analysis, _render
from monarch_dashboard._model import MAX_RAISED_PER_ENDPOINT, MAX_RAISED_PER_RANK, JobModel


def test_exception_messages_and_tracebacks_per_endpoint_and_rank_are_kept_bounded() -> None:
    m = JobModel()
    m.ingest(job(1, 4))
    m.ingest([metric("server", r, 50, 1_000_000, errors={"ValueError": 30} if r == 1 else None, proc=f"p{r}")
              for r in range(4)])
    m.ingest([raised(1, i) for i in range(30)] + [raised(2, 100)])
    (row,) = m.endpoint_rows()
    assert len(row.raised) == MAX_RAISED_PER_ENDPOINT
    assert row.raised[0]["message"] == "bad batch 100" and row.raised[1]["message"] == "bad batch 29"  # newest first
    r1 = next(k for k in row.ranks if k.rank == 1)
    assert [e["message"] for e in r1.raised] == [f"bad batch {i}" for i in (29, 28, 27)][:MAX_RAISED_PER_RANK]
    html = _render.live(m, "endpoints", {})
    assert "last: <b>ValueError</b>: bad batch 100" in html
    assert "raise ValueError(f&#34;bad batch {i}&#34;)" in html  # the traceback, escaped
    assert 'class="raised-item" data-rank="1"' in html


def test_failures_at_the_caller_are_counted_apart_from_what_the_endpoint_raised() -> None:
    m = JobModel()
    m.ingest([metric("server", 0, 10, 1_000_000, proc="p0"), metric("server", 1, 9, 1_000_000, proc="p1"),
              metric("client", 1, 12, 2_000_000, errors={"SupervisionError": 3, "ActorError": 1}, proc="c")])
    (row,) = m.endpoint_rows()
    assert row.errors == {} and row.caller_errors == {"SupervisionError": 3}  # ActorError: the endpoint raised
    assert {k.rank: k.caller_error_count for k in row.ranks} == {0: 0, 1: 3}
    html = _render.live(m, "endpoints", {})
    assert "caller: SupervisionError 3" in html and "<span class=\"dim\">0</span>" not in html.split("</tr>")[1]


def test_no_straggler_among_equal_ranks_one_for_a_real_outlier() -> None:
    m = JobModel()
    m.ingest([metric("server", r, 151 if r == 0 else 150, 2_000_000, proc=f"p{r}") for r in range(4)])
    (row,) = m.endpoint_rows()
    assert not any(k.slow for k in row.ranks)  # 151 vs 150 calls of the same time: nobody is slow
    assert 'class="rank slow"' not in _render.live(m, "endpoints", {})
    m.ingest([metric("server", 3, 150, 30_000_000, proc="p3")])
    (row,) = m.endpoint_rows()
    assert [k.rank for k in row.ranks if k.slow] == [3]
    html = _render.live(m, "endpoints", {})
    assert 'class="rank slow" data-rank="3"' in html and str(html_escape(_analysis.STRAGGLER_RULE)) in html
    # sub-millisecond jitter is never a straggler, however large the ratio
    assert _analysis.stragglers({0: 10_000.0, 1: 10_000.0, 2: 400_000.0}) == set()
    assert _analysis.stragglers({0: 5e6}) == set()


def test_a_killed_proc_is_one_group_root_cause_first() -> None:
    m = JobModel()
    m.ingest(job(2, 4, killed=5))
    # an unrelated user error in another actor, later: a second group
    m.ingest([lifecycle("actor.failed", time.time_ns(), mesh="eval", mesh_key="eval-1",
                        actor="eval{'procs': 0/1}", actor_id="x", rank=0, coords="{'procs': 0/1}", class_name="E",
                        endpoint="run", category="user", cause="ValueError: nope")])
    groups = m.failure_groups()
    assert len(groups) == 2 and m.counts()["failures"] == 2 and m.counts()["failure_events"] == 4
    kill = groups[1]
    assert kill["root"]["name"] == "proc.failed"
    assert [c["name"] for c in kill["children"]] == ["supervision.event", "supervision.handled"]
    html = _render.live(m, "failures", {})
    assert html.count('class="failure-group"') == 2 and html.count("root cause</span>") == 2


def test_a_256_proc_job_reads_on_one_screen() -> None:
    m = JobModel()
    m.ingest(job(32, 8, killed=77))
    (s,) = m.mesh_summaries()
    assert (s["running"], s["total"], s["failed"]) == (255, 256, 1)
    assert [c["rank"] for c in s["grid"]] == list(range(256)) and s["grid"][77]["state"] == "failed"
    html = _render.live(m, "job", {})
    assert "255/256 running" in html and html.count('class="cell st-') == 256
    opened = re.findall(r'<details class="host" id="host-cluster-(\w+)"( open)?>', html)
    assert len(opened) == 32 and [h for h, o in opened if o] == ["node09"]  # only the host with the failure is open


def test_the_timeline_has_a_time_axis_and_lanes_in_rank_order() -> None:
    spans = []
    for r in (2, 10, 0, 3, 1):
        spans.append(("w.step", 1_000_000_000 + r * 1_000_000, 40_000_000 if r == 0 else 200_000,
                      {"proc_name": f"procs0{{'procs': {r}/12}}", "thread": "main", "span_kind": "server"}))
    spans.append(("w.step", 1_000_000_000, 50_000_000, {"proc_name": "client", "thread": "main", "span_kind": "client"}))
    svg = _render.timeline_svg(spans)
    assert [ln["name"].split(" · ")[0] for ln in svg["lanes"]] == [
        "client"] + [f"procs0{{'procs': {r}/12}}" for r in (0, 1, 2, 3, 10)]
    assert [t["label"] for t in svg["ticks"]][:3] == ["0 ms", "10 ms", "20 ms"] and len(svg["ticks"]) == 6
    assert svg["ticks"][0]["x"] == svg["left"]
    assert _render.lane_label("procs0{'hosts': 1/2, 'procs': 3/4} · w{'hosts': 1/2, 'procs': 3/4}") == \
        "procs0{'hosts': 1/2, 'procs': 3/4} · w"  # the actor's thread, without repeating its coordinates
    labelled = {r["label"] for r in svg["rects"]}
    assert "w.step" in labelled and "" in labelled  # written where it fits, not in the 0.2 ms slivers


def test_one_name_per_host_and_log_search_with_timestamps() -> None:
    m = JobModel()
    m.ingest([lifecycle("host_mesh.spawned", 1, mesh="this_host", hosts=["localhost"], scheduler=None)])
    assert m.host_display("localhost") == "vm" and m.host_display("node03") == "node03"
    m.add_output("stdout", ["[w{'procs': 0/2} localhost] loss 0.5", "[w{'procs': 1/2} localhost] NaN in grad",
                            "plain client print"])
    assert [ln.prefix for ln in m.log_view()][:2] == ["[w{'procs': 0/2} vm]", "[w{'procs': 1/2} vm]"]
    assert [ln.text for ln in m.log_view(search="nan")] == ["NaN in grad"]
    assert [ln.text for ln in m.log_view(search="PROCS': 0")] == ["loss 0.5"]  # the prefix is searched too
    html = _render.live(m, "logs", {"search": "nan"})
    assert re.search(r'<span class="ts">\d\d:\d\d:\d\d\.\d{3}</span> <span class="prefix">', html)
    assert "loss 0.5" not in html


def test_the_end_of_the_job_is_shown_with_the_last_state() -> None:
    m = JobModel()
    m.ingest(job(1, 2))
    assert "job ended" not in _render.page(m, "job", {})
    m.end()
    page = _render.page(m, "job", {})
    assert re.search(r'id="conn" class="conn ended" data-ended="1">job ended at \d\d:\d\d:\d\d<', page)
    assert "2/2 running" in page
