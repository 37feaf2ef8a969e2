"""The dashboard of a live job, in a real Chromium: the tree shows every proc,
100 calls show as 100 with a histogram, a killed proc shows its failure on the
job page and its event on the failures page without a reload, a line printed
by rank 3 appears with its prefix; a screenshot of each page is saved."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(400)  # a job, a browser and six pages on a loaded machine

WAIT_MS = 30_000  # "within a few seconds" on a loaded 2-core machine: updates come each 0.25-0.5 s


def _expect() -> Any:
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT_MS)
    return expect


def test_a_live_job_in_a_real_browser(job: Any, browser: Any, screenshots: Path) -> None:
    expect = _expect()
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    try:
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(job.url)
        assert page.url.endswith("/job"), page.url  # the token is kept in a cookie, the URL loses it
        expect(page.locator("#conn")).to_have_text("live")

        # the tree: 2 hosts, every proc with its pid, running
        procs = page.locator("li.proc")
        expect(procs).to_have_count(8)
        expect(page.locator("li.host")).to_have_count(2)
        expect(page.locator("li.proc.state-running")).to_have_count(8)
        for r in range(8):
            expect(page.locator(f'li.proc[data-rank="{r}"]')).to_contain_text("pid ")
        expect(page.locator('li.host[data-host="local0"] li.proc')).to_have_count(4)
        page.evaluate("window.__not_reloaded = 1")

        # a second tab on the failures page, open before anything fails
        failures = context.new_page()
        failures.goto(f"http://127.0.0.1:{job.port}/failures")
        expect(failures.locator("#conn")).to_have_text("live")
        expect(failures.locator("tr.failure")).to_have_count(0)
        failures.evaluate("window.__not_reloaded = 1")

        # endpoints: 100 calls, a histogram, the per-rank breakdown with its slow rank
        eps = context.new_page()
        eps.goto(f"http://127.0.0.1:{job.port}/endpoints")
        job.do("calls 100")
        job.do("work")
        ping = eps.locator('tbody[data-endpoint="ping"]')
        expect(ping.locator("td.calls")).to_have_text("100")
        expect(ping.locator("svg.hist rect").first).to_be_attached()
        work = eps.locator('tbody[data-endpoint="work"]')
        expect(work.locator("td.calls")).to_have_text("160")  # 20 calls x 8 ranks
        work.locator("tr.row").click()
        expect(work.locator("tr.ranks table.per-rank tr")).to_have_count(9)  # header + 8 ranks
        expect(work.locator("tr.ranks tr.slow td").first).to_have_text("5")  # the slow rank stands out
        eps.screenshot(path=str(screenshots / "dashboard-endpoints.png"), full_page=True)

        # logs: rank 3's line with its prefix, following the tail, filterable
        logs = context.new_page()
        logs.goto(f"http://127.0.0.1:{job.port}/logs")
        expect(logs.locator("#conn")).to_have_text("live")
        job.do("log 3 hello from rank three")
        line = logs.locator("#log-lines .line", has_text="hello from rank three")
        expect(line).to_have_count(1)
        expect(line.locator(".prefix")).to_have_text("[w{'hosts': 0/2, 'procs': 3/4} local0]")
        expect(logs.locator("#f-mesh option", has_text="w")).to_have_count(1)  # the meshes seen so far, live
        logs.fill("#f-rank", "3")
        logs.dispatch_event("#f-rank", "change")
        expect(logs.locator("#log-lines .line", has_text="hello from rank three")).to_have_count(1)
        logs.screenshot(path=str(screenshots / "dashboard-logs.png"), full_page=True)
        logs.fill("#f-rank", "2")
        logs.dispatch_event("#f-rank", "change")
        expect(logs.locator("#log-lines .line", has_text="hello from rank three")).to_have_count(0)

        page.screenshot(path=str(screenshots / "dashboard-job.png"), full_page=True)

        # kill rank 3's proc: its node shows the failure, the failures page its event, no reload
        job.do("kill 3")
        dead = page.locator('li.proc[data-rank="3"]')
        expect(dead).to_have_class("node proc state-failed")
        expect(dead.locator(".why").first).to_contain_text("killed by SIGKILL")
        expect(dead).to_contain_text("first failure")
        expect(page.locator("li.proc.state-running")).to_have_count(7)
        assert page.evaluate("window.__not_reloaded") == 1
        page.screenshot(path=str(screenshots / "dashboard-job-failed.png"), full_page=True)

        event = failures.locator('tr.failure[data-event="proc.failed"]')
        expect(event).to_have_count(1)
        expect(event).to_contain_text("SIGKILL")
        expect(event).to_contain_text("local0")
        sup = failures.locator('tr.failure[data-event="supervision.event"]')
        expect(sup).to_have_count(1)
        expect(sup).to_contain_text("infrastructure")
        expect(sup).to_contain_text("its process died")
        assert failures.evaluate("window.__not_reloaded") == 1
        failures.screenshot(path=str(screenshots / "dashboard-failures.png"), full_page=True)

        # the timeline: a short recording while calls run, then the trace to download
        tl = context.new_page()
        tl.goto(f"http://127.0.0.1:{job.port}/timeline")
        tl.fill("#rec-seconds", "2")
        tl.click("#record")
        job.do("calls 20")
        expect(tl.locator("svg.timeline rect.span").first).to_be_attached()
        download_link = tl.locator("#download")
        expect(download_link).to_be_visible()
        with tl.expect_download() as dl:
            download_link.click()
        trace = json.loads(Path(dl.value.path()).read_text())  # Chrome trace events, as record_trace writes them
        assert any(e.get("name") == "w.ping" and e.get("ph") == "X" for e in trace), trace[:5]
        tl.screenshot(path=str(screenshots / "dashboard-timeline.png"), full_page=True)
        assert errors == [], errors
    finally:
        context.close()
