"""The root folds stopped meshes' rows into one per (side, class, endpoint)
with a running sum (``_metrics._Folded``); it must give what summing the rows
with :func:`combine` gives (the documented rule), for any rows."""

from __future__ import annotations

import random

import pytest

from monarch_core._telemetry import _metrics as M

pytestmark = pytest.mark.unit


def _snap(rng: random.Random, mesh: str, adverb: str) -> tuple:
    count = rng.choice([0, 0, 1, 5, 17])
    buckets = {rng.randrange(0, 200): rng.randrange(1, 9) for _ in range(rng.randrange(0, 4))}
    errors = {t: rng.randrange(1, 3) for t in rng.sample(["ValueError", "KeyError", "TypeError"], rng.randrange(0, 3))}
    mn = rng.randrange(1, 1000) if count else 0
    return (("server", f"key-{mesh}", mesh, "step", rng.randrange(0, 8), adverb), rng.randrange(0, 50), errors,
            count, rng.randrange(0, 10**6), mn, mn + rng.randrange(0, 10**5), buckets, rng.randrange(0, 999),
            rng.randrange(0, 999))


@pytest.mark.parametrize("seed", range(20))
def test_folding_in_place_equals_combining_the_rows(seed: int) -> None:
    rng = random.Random(seed)
    rows = [(_snap(rng, rng.choice(["a", "a", "b"]), rng.choice(["", "", "call"])), rng.choice(["p0", "p1"]),
             rng.choice(["h0", "h0", "h1"])) for _ in range(rng.randrange(1, 12))]
    folded = M._Folded(*rows[0])
    for snap, proc, host in rows[1:]:
        folded.add(snap, proc, host)
    got = folded.metrics()
    # the rule, spelled with combine(): rank None, mesh_key "*", mesh "*" unless all rows agree
    want = M.combine([M.from_snapshot(s, p, h) for s, p, h in rows], by=("side", "endpoint"))[0]
    meshes = {s[0][2] for s, _p, _h in rows}
    assert got.mesh == (meshes.pop() if len(meshes) == 1 else "*")
    assert (got.rank, got.mesh_key) == (None, "*")
    for f in ("side", "endpoint", "adverb", "proc", "host", "calls", "request_bytes", "reply_bytes"):
        assert getattr(got, f) == getattr(want, f), f
    assert dict(got.errors) == dict(want.errors)
    assert (got.latency.count, got.latency.sum_ns, got.latency.min_ns, got.latency.max_ns) == (
        want.latency.count, want.latency.sum_ns, want.latency.min_ns, want.latency.max_ns)
    assert dict(got.latency.buckets) == dict(want.latency.buckets)
