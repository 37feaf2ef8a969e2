"""``@concurrent_endpoint`` misuse is refused when the class is defined, with the reference's
(torchmonarch 0.7.0) ``ValueError`` wording and the fix: on a synchronous method, and on top of
``@endpoint``."""

from __future__ import annotations

import pytest

from monarch_core.actor import Actor, concurrent_endpoint, endpoint

pytestmark = pytest.mark.unit


def test_concurrent_endpoint_on_a_synchronous_method_says_it_wraps_only_async_endpoints() -> None:
    with pytest.raises(ValueError, match="can only wrap async endpoints") as info:

        class Sync(Actor):
            @concurrent_endpoint
            def ping(self) -> str:
                return "pong"

    assert "Sync.ping" in str(info.value) and "async def" in str(info.value)


def test_concurrent_endpoint_on_top_of_endpoint_says_it_does_not_wrap_endpoint() -> None:
    with pytest.raises(ValueError, match="does not wrap @endpoint") as info:

        class Stacked(Actor):
            @concurrent_endpoint
            @endpoint
            async def ping(self) -> str:
                return "pong"

    assert "Stacked.ping" in str(info.value) and "alone" in str(info.value)
    assert "synchronous" not in str(info.value)  # it is async: the old message misnamed the problem
