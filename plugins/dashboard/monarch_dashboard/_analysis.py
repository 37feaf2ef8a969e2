"""What the dashboard concludes from the raw figures: which rank is a straggler,
and which failure events are one cascade.  Pure functions of plain data (the
model calls them under its lock; the tests call them directly).

**Stragglers** (:func:`stragglers`): a rank is marked only when it is a real
outlier -- its mean time per call is more than :data:`STRAGGLER_FACTOR` times the
median of the *other* ranks' means **and** at least :data:`STRAGGLER_FLOOR_NS`
above it.  Means, not totals: a rank that served 151 calls while the others
served 150 is not slow.  Fewer than 2 ranks with calls: nobody is marked.

**Cascades** (:func:`group_failures`): the failure events of one root cause form
one group, root cause first.  Events are linked by what they name: a
``proc.failed`` by its proc (``<proc mesh><coords>``), an ``actor.failed`` by its
actor, a ``supervision.event`` by its root cause's actor and proc and by every
actor of its chain, a ``supervision.handled`` by the mesh whose supervision
event it answers.  An event that names something a group already holds joins
that group; otherwise it starts a new one.  A group's root is its
``proc.failed`` (a process died: everything else follows from it), else the
``actor.failed`` of the supervision events' root-cause actor, else its first event.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

#: a straggler's mean time per call is more than this many times the others' median ...
STRAGGLER_FACTOR = 1.5
#: ... and at least this many ns above it (sub-millisecond jitter is never a straggler)
STRAGGLER_FLOOR_NS = 1_000_000
#: the rule, as the endpoints page's tooltip and the docs state it
STRAGGLER_RULE = (f"a rank is marked slow when its mean time per call is more than {STRAGGLER_FACTOR:g}x the median "
                  f"of the other ranks' means and at least {STRAGGLER_FLOOR_NS / 1e6:g} ms above it")

_PROC_IN_TEXT = re.compile(r"^proc (?P<label>\S+?\{[^}]*\}|\S+)")


def stragglers(means: Mapping[int, Optional[float]]) -> set[int]:
    """The ranks (keys of ``means``: rank -> mean ns per call, None without calls)
    that are outliers by the rule of the module docstring."""
    have = {r: m for r, m in means.items() if m is not None}
    if len(have) < 2:
        return set()
    out = set()
    for r, m in have.items():
        others = statistics.median(v for k, v in have.items() if k != r)
        if m > STRAGGLER_FACTOR * others and m - others >= STRAGGLER_FLOOR_NS:
            out.add(r)
    return out


def proc_label(text: Any) -> str:
    """``procs0{'hosts': 1/2}`` from a root cause's ``proc`` (``"proc procs0{...} on host h"``)."""
    m = _PROC_IN_TEXT.match(str(text or ""))
    return m.group("label") if m else ""


def _keys(ev: Mapping[str, Any], label_of: Callable[[str], str]) -> set[tuple[str, str]]:
    name = ev.get("name")
    keys: set[tuple[str, str]] = set()
    if name == "proc.failed":
        keys.add(("proc", label_of(str(ev.get("proc_id")))))
    elif name == "actor.failed":
        keys.add(("actor", str(ev.get("actor"))))
    elif name == "supervision.event":
        root = dict(ev.get("root_cause") or {})
        if root.get("actor"):
            keys.add(("actor", str(root["actor"])))
        if proc_label(root.get("proc")):
            keys.add(("proc", proc_label(root.get("proc"))))
        for a in ev.get("chain") or ():
            keys.add(("actor", str(a).split(" ", 1)[0]))
        keys.add(("supervised", str(ev.get("mesh"))))
    elif name == "supervision.handled":
        keys.add(("supervised", str(ev.get("mesh"))))
    elif name == "host_mesh.lost_host":
        keys.add(("host", str(ev.get("host_name"))))
    keys.discard(("proc", ""))
    return keys


def _is_root(ev: Mapping[str, Any], roots: set[str]) -> int:
    """How strongly ``ev`` is its group's root (higher first)."""
    name = ev.get("name")
    if name == "host_mesh.lost_host":
        return 4
    if name == "proc.failed":
        return 3
    if name == "actor.failed" and str(ev.get("actor")) in roots:
        return 2
    return 0


def group_failures(events: Sequence[Mapping[str, Any]], label_of: Callable[[str], str]) -> list[dict[str, Any]]:
    """The failure events (time order) grouped by root cause, newest group first:
    each ``{"root": event, "children": [events, time order], "events": n}``.
    ``label_of(proc_id)``: the proc's ``<proc mesh><coords>`` label (as root causes name it)."""
    groups: list[tuple[set[tuple[str, str]], list[Mapping[str, Any]]]] = []
    for ev in sorted(events, key=lambda e: e.get("time_ns", 0)):
        keys = _keys(ev, label_of)
        home = None
        for gkeys, members in reversed(groups):
            if keys & gkeys and not (ev.get("name") == "supervision.handled" and not any(
                    m.get("name") == "supervision.event" for m in members)):
                home = (gkeys, members)
                break
        if home is None:
            groups.append((set(keys), [ev]))
        else:
            home[0].update(k for k in keys if k[0] != "supervised" or ev.get("name") != "supervision.handled")
            home[1].append(ev)
    out = []
    for _keys_, members in groups:
        roots = {str(dict(m.get("root_cause") or {}).get("actor")) for m in members if m.get("name") == "supervision.event"}
        best = max(range(len(members)), key=lambda i: (_is_root(members[i], roots), -i))
        root = members[best]
        out.append({"root": root, "children": [m for i, m in enumerate(members) if i != best], "events": len(members),
                    "time_ns": root.get("time_ns", 0)})
    out.reverse()
    return out

