"""The stopped sessions the debug controller keeps, and what a debugger does with them.

Everything here runs on the controller's asyncio loop (its endpoints and the
server's connections share it): no locks.  A :class:`Session` is one rank
between its first stop and its end; ``pdb_read`` from the proc makes it
``stopped`` (its answer is the next command), a command sent to it makes it
``running`` until the next ``pdb_read`` (``stopped``) or ``pdb_end``
(``ended``).  Output a rank prints is kept until a debugger is shown it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

__all__ = ["Registry", "Session"]


class Session:
    """One rank stopped in (or running between stops of) a pdb session."""

    def __init__(self, sid: str, actor: str, info: dict[str, Any]) -> None:
        self.id = sid
        self.actor = actor  # the name shown (mesh name, made unique per mesh)
        self.info = info
        self.state = "stopped"  # stopped | running | ended
        self.why = ""
        self.output: list[str] = []  # printed, not shown to a debugger yet
        self.reply: asyncio.Future | None = None  # answers the pending pdb_read
        self.since = time.time()
        self._event = asyncio.Event()

    def changed(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait_not_running(self, timeout: float) -> None:
        """Until the session stops again or ends, or ``timeout`` seconds pass."""
        deadline = time.monotonic() + max(0.0, timeout)
        while self.state == "running":
            left = deadline - time.monotonic()
            if left <= 0:
                return
            try:
                await asyncio.wait_for(self._event.wait(), left)
            except asyncio.TimeoutError:
                return

    def take(self) -> dict[str, Any]:
        """What to show now: the output not shown yet, and the state."""
        out = "".join(self.output)
        self.output.clear()
        return {"output": out, "state": self.state, "why": self.why, "prompt": self.info.get("prompt", "(Pdb) ")}

    def row(self) -> dict[str, Any]:
        i = self.info
        return {
            "id": self.id,
            "actor": self.actor,
            "rank": i.get("rank"),
            "labels": i.get("labels", []),
            "sizes": i.get("sizes", []),
            "coords": i.get("coords", []),
            "hostname": i.get("hostname", "?"),
            "function": i.get("function", "?"),
            "filename": i.get("filename", "?"),
            "lineno": i.get("lineno", 0),
            "post_mortem": bool(i.get("post_mortem")),
            "state": self.state,
        }


class Registry:
    """The sessions, and the operations the server runs on them (on the controller's loop)."""

    def __init__(self) -> None:
        self.sessions: dict[str, Session] = {}
        self._names: dict[str, str] = {}  # mesh key -> the name shown
        self.on_new_stop: Any = None  # called with the session when a rank stops anew
        self.closing = asyncio.Event()  # the controller stops: nothing waits any longer

    # -- from the procs
    async def stopped(self, sid: str, info: dict[str, Any], output: str) -> tuple[str, str]:
        s = self.sessions.get(sid)
        new = s is None
        if s is None:
            s = self.sessions[sid] = Session(sid, self._name(info), info)
        s.info = info
        if output:
            s.output.append(output)
        s.state = "stopped"
        fut = asyncio.get_running_loop().create_future()
        s.reply = fut
        s.changed()
        if new and self.on_new_stop is not None:
            self.on_new_stop(s)
        try:
            return await fut  # type: ignore[no-any-return]
        finally:
            if s.reply is fut:
                s.reply = None

    def ended(self, sid: str, output: str, why: str) -> None:
        s = self.sessions.pop(sid, None)
        if s is None:
            return
        if output:
            s.output.append(output)
        s.state, s.why = "ended", why
        if s.reply is not None and not s.reply.done():
            s.reply.cancel()
        s.changed()

    def _name(self, info: dict[str, Any]) -> str:
        key = str(info.get("mesh"))
        name = self._names.get(key)
        if name is None:
            base = str(info.get("actor") or "actor")
            name, n = base, 1
            taken = set(self._names.values())
            while name in taken:  # two meshes with one name: the second shows as name#2
                n += 1
                name = f"{base}#{n}"
            self._names[key] = name
        return name

    # -- from the debugger
    def stopped_sessions(self) -> list[Session]:
        return sorted((s for s in self.sessions.values() if s.state == "stopped"),
                      key=lambda s: (s.actor, s.info.get("rank", 0)))

    def get(self, sid: str) -> Session:
        s = self.sessions.get(sid)
        if s is None:
            raise LookupError("that rank is no longer stopped at a breakpoint (it continued, or its endpoint "
                              "returned); 'list' shows the ranks that are")
        return s

    def attach(self, sid: str) -> dict[str, Any]:
        s = self.get(sid)
        r = s.take()
        if not r["output"] and s.state == "stopped":
            r["output"] = s.info.get("where", "")
        return r

    def _answer(self, s: Session, kind: str, line: str) -> bool:
        if s.state != "stopped" or s.reply is None or s.reply.done():
            return False
        s.reply.set_result((kind, line))
        s.reply = None
        s.state = "running"
        s.changed()
        return True

    async def send(self, sid: str, line: str, wait: float) -> dict[str, Any]:
        s = self.get(sid)
        if not self._answer(s, "line", line):
            raise LookupError(f"{s.actor} rank {s.info.get('rank')} is running, not at a prompt; "
                              "wait for it to stop (or 'detach')")
        await s.wait_not_running(wait)
        return s.take()

    async def wait(self, sid: str, wait: float) -> dict[str, Any]:
        s = self.sessions.get(sid)
        if s is None:
            return {"output": "", "state": "ended", "why": "it is no longer stopped", "prompt": "(Pdb) "}
        await s.wait_not_running(wait)
        return s.take()

    async def cast(self, sids: list[str], line: str, wait: float, kind: str = "line") -> dict[str, Any]:
        chosen = [self.sessions[sid] for sid in sids if sid in self.sessions]
        missing = [sid for sid in sids if sid not in self.sessions]
        sent = [s for s in chosen if self._answer(s, kind, line)]
        busy = [s for s in chosen if s not in sent]
        await asyncio.gather(*(s.wait_not_running(wait) for s in sent))
        results = {s.id: s.take() for s in sent}
        for s in busy:
            results[s.id] = {"output": "", "state": "running", "why": "it was not at a prompt", "prompt": ""}
        for sid in missing:
            results[sid] = {"output": "", "state": "ended", "why": "it is no longer stopped", "prompt": ""}
        return results

    async def continue_all(self, wait: float) -> dict[str, Any]:
        sids = [s.id for s in self.stopped_sessions()]
        results = await self.cast(sids, "", wait, kind="continue_all")
        try:  # post-mortem stops follow their session's end at once
            await asyncio.wait_for(self.closing.wait(), 0.2)
        except asyncio.TimeoutError:
            pass
        return {"results": results, "stopped": [s.row() for s in self.stopped_sessions()]}

    def release_all(self, why: str) -> None:
        for s in list(self.sessions.values()):
            if s.reply is not None and not s.reply.done():
                s.reply.set_result(("release", why))
