"""More of torchmonarch 0.7.0's surface, as programs written for it use it:
``monarch_core.config``'s ``configure``/``configured``, ``returns_future``,
the worker-loop names importable from ``monarch_core.actor``,
``logging_option`` awaited, ``ChannelTransport.Local``, the error class of
``@concurrent_endpoint`` on a synchronous method and
``BootstrapCommand.inherit_env``."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import os
import pickle
import threading
import time

import pytest

from monarch_core import config, settings
from monarch_core.actor import Actor, ChannelTransport, concurrent_endpoint, endpoint, this_host
from monarch_core.errors import ConfigError


def test_configure_sets_a_setting_for_this_process_and_the_procs_it_starts() -> None:
    class Env(Actor):
        @endpoint
        def get(self, name: str) -> str | None:
            return os.environ.get(name)

    before = os.environ.get("MONARCH_DELIVERY_TIMEOUT")
    try:
        config.configure(delivery_timeout=7.5)
        assert settings.get("MONARCH_DELIVERY_TIMEOUT") == 7.5
        pm = this_host().spawn_procs(per_host={"gpus": 1})
        try:
            assert pm.spawn("env", Env).get.call_one("MONARCH_DELIVERY_TIMEOUT").get(timeout=60) == "7.5"
        finally:
            pm.stop().get(timeout=60)
        config.configure(MONARCH_DELIVERY_TIMEOUT=None)  # back to the default
        assert settings.get("MONARCH_DELIVERY_TIMEOUT") == settings.SETTINGS["MONARCH_DELIVERY_TIMEOUT"].default
    finally:
        if before is not None:
            os.environ["MONARCH_DELIVERY_TIMEOUT"] = before


def test_configured_restores_and_bad_values_change_nothing() -> None:
    before = os.environ.get("MONARCH_DELIVERY_TIMEOUT")
    with config.configured(delivery_timeout=3) as now:
        assert now["MONARCH_DELIVERY_TIMEOUT"] == 3.0
        with pytest.raises(ConfigError, match="MONARCH_DELIVERY_TIMEOUT must be a number of seconds"):
            config.configure(delivery_timeout="soon", log_level="DEBUG")
        assert settings.get("MONARCH_DELIVERY_TIMEOUT") == 3.0   # nothing of the failed call was set
        assert os.environ.get("MONARCH_LOG_LEVEL") != "DEBUG" or before is not None
    assert os.environ.get("MONARCH_DELIVERY_TIMEOUT") == before
    with pytest.raises(ConfigError, match="did you mean MONARCH_DELIVERY_TIMEOUT"):
        config.configure(delivery_timout=1)
    with pytest.raises(ConfigError, match="sets MONARCH_DELIVERY_TIMEOUT a second time"):
        config.configure(delivery_timeout=1, MONARCH_DELIVERY_TIMEOUT=2)
    assert os.environ.get("MONARCH_DELIVERY_TIMEOUT") == before


def test_the_worker_loop_names_and_returns_future_are_importable_from_actor() -> None:
    import monarch_core.actor as actor
    import monarch_core.worker as worker

    assert actor.attach_to_workers is worker.attach_to_workers
    assert actor.run_worker_loop_forever is worker.run_worker_loop_forever
    assert callable(actor.returns_future)


VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="unset")


def test_returns_future_runs_its_body_where_it_is_first_observed() -> None:
    from monarch_core.actor import returns_future

    where: list = []

    @returns_future
    async def body(x: int) -> int:
        where.append((threading.get_ident(), VAR.get(), asyncio.get_running_loop()))
        await asyncio.sleep(0)
        return x * 2

    VAR.set("caller's")
    fut = body(21)
    VAR.set("after the call")
    assert where == []                                    # nothing runs before it is observed
    assert fut.get(timeout=10) == 42
    assert where[0][:2] == (threading.get_ident(), "caller's")   # on this thread, in the call's context
    assert fut.get() == 42 and len(where) == 1           # observed again: the same result, run once

    async def awaiting() -> int:
        return await body(5)                              # await owns it: runs inside this coroutine
    assert asyncio.run(awaiting()) == 10

    loops: list = []

    def in_a_thread() -> None:
        body(1).get(timeout=10)
        loops.append(where[-1][2])
    t = threading.Thread(target=in_a_thread)
    t.start()
    t.join(10)
    gc.collect()
    assert loops and loops[0].is_closed()                 # the thread's loop closed with the thread


def test_returns_future_get_with_a_timeout_cancels_the_body() -> None:
    from monarch_core.actor import returns_future

    seen: list = []

    @returns_future
    async def slow() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    fut = slow()
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="cancelled"):
        fut.get(timeout=0.2)
    assert seen == ["cancelled"] and time.monotonic() - t0 < 10
    with pytest.raises(TimeoutError, match="cancelled"):  # the same outcome for every later observer
        fut.get()
    with pytest.raises(TypeError, match="decorates an async def"):
        returns_future(lambda: 1)  # type: ignore[arg-type]


def test_logging_option_can_be_awaited_as_in_the_reference() -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        assert asyncio.run(pm.logging_option(stream_to_client=True, aggregate_window_sec=3)) is None
        pm.logging_option(stream_to_client=False)       # and called plainly, it has been applied already
    finally:
        pm.stop().get(timeout=60)


def test_channel_transport_has_local_and_every_member_pickles() -> None:
    from monarch_core._proc._transport import parse_transport

    assert ChannelTransport.Local.value == "inproc" and parse_transport(ChannelTransport.Local).name == "inproc"
    for member in ChannelTransport:
        assert pickle.loads(pickle.dumps(member)) is member


def test_concurrent_endpoint_on_a_sync_method_is_a_value_error_and_a_type_error() -> None:
    for kind in (ValueError, TypeError):
        with pytest.raises(kind, match="needs an async method"):
            class Bad(Actor):
                @concurrent_endpoint
                def sync(self) -> None:
                    pass


def test_bootstrap_command_inherit_env_false_gives_the_proc_only_what_the_command_says() -> None:
    import sys

    from monarch_core.actor import BootstrapCommand

    class Env(Actor):
        @endpoint
        def get(self, names: list) -> dict:
            return {n: os.environ.get(n) for n in names}

    names = ["COMPAT_FROM_CLIENT", "COMPAT_FROM_COMMAND", "MONARCH_DELIVERY_TIMEOUT"]
    os.environ["COMPAT_FROM_CLIENT"] = "client"
    try:
        with config.configured(delivery_timeout=9):
            got = {}
            for inherit in (True, False):
                cmd = BootstrapCommand(sys.executable, env={"COMPAT_FROM_COMMAND": "cmd"}, inherit_env=inherit)
                pm = this_host().spawn_procs(per_host={"gpus": 1}, bootstrap_command=cmd)
                try:
                    got[inherit] = pm.spawn("env", Env).get.call_one(names).get(timeout=60)
                finally:
                    pm.stop().get(timeout=60)
    finally:
        del os.environ["COMPAT_FROM_CLIENT"]
    assert got[True] == {"COMPAT_FROM_CLIENT": "client", "COMPAT_FROM_COMMAND": "cmd", "MONARCH_DELIVERY_TIMEOUT": "9"}
    assert got[False] == {"COMPAT_FROM_CLIENT": None, "COMPAT_FROM_COMMAND": "cmd", "MONARCH_DELIVERY_TIMEOUT": "9"}
    with pytest.raises(TypeError, match="inherit_env must be True or False"):
        BootstrapCommand(sys.executable, inherit_env="no")  # type: ignore[arg-type]


class SyncActor(Actor):
    """No async endpoint: a synchronous actor in the reference's sense."""

    @endpoint
    def ping(self) -> str:
        return "pong"

    async def later(self) -> str:
        return "later"

    def plain(self) -> str:
        return "plain"


class AsyncActor(Actor):
    @endpoint
    async def ping(self) -> str:
        return "pong"

    async def later(self) -> str:
        return "later"


def test_as_endpoint_of_an_async_method_is_refused_on_a_synchronous_actor_only() -> None:
    from monarch_core.actor import ActorError, as_endpoint

    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        sync = pm.spawn("sync_actor", SyncActor)
        with pytest.raises(ActorError, match=r"later is async, and SyncActor is a synchronous actor"):
            as_endpoint(sync.later).call_one().get(timeout=60)
        assert as_endpoint(sync.plain).call_one().get(timeout=60) == "plain"
        assert sync.ping.call_one().get(timeout=60) == "pong"        # the actor goes on
        asynchronous = pm.spawn("async_actor", AsyncActor)
        assert as_endpoint(asynchronous.later).call_one().get(timeout=60) == "later"
    finally:
        pm.stop().get(timeout=60)


class Child(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Controller(Actor):
    @endpoint
    def spawn_child(self) -> tuple:
        from monarch_core.actor import context

        child = context().actor_instance.proc.spawn("ctl_child", Child)
        return os.getpid(), child.pid.call_one().get(timeout=30)


def test_a_controller_in_the_client_spawns_through_its_context_into_the_client_process() -> None:
    from monarch_core.actor import get_or_spawn_controller

    ctl = get_or_spawn_controller("compat_controller", Controller).get(timeout=60)
    assert ctl.spawn_child.call_one().get(timeout=60) == (os.getpid(), os.getpid())
