"""``timeouts.timeout`` behaves like 3.11's ``asyncio.timeout`` on every supported Python.

The 3.10 implementation is tested directly on every version; the test environments
``py310``/``py312``/``py313`` run this file under those interpreters."""

from __future__ import annotations

import asyncio
import sys

import pytest

from lmcache_valkey import timeouts
from lmcache_valkey.timeouts import _Timeout310

IMPLEMENTATIONS = [pytest.param(_Timeout310, id="own")]
if sys.version_info >= (3, 11):
    IMPLEMENTATIONS.append(pytest.param(asyncio.timeout, id="asyncio"))


def test_the_package_uses_asyncio_timeout_where_python_has_one():
    if sys.version_info >= (3, 11):
        assert timeouts.timeout is asyncio.timeout
    else:
        assert timeouts.timeout is _Timeout310


@pytest.mark.parametrize("make", IMPLEMENTATIONS)
def test_a_body_past_its_deadline_raises_timeout_error_catchable_by_both_names(make):
    async def body() -> str:
        caught = []
        for name, kind in (("builtin", TimeoutError), ("asyncio", asyncio.TimeoutError)):
            try:
                async with make(0.01):
                    await asyncio.sleep(10)
            except kind:
                caught.append(name)
        return ",".join(caught)

    assert asyncio.run(asyncio.wait_for(body(), 5)) == "builtin,asyncio"


@pytest.mark.parametrize("make", IMPLEMENTATIONS)
def test_a_body_within_its_deadline_is_untouched_and_not_cancelled_later(make):
    async def body() -> int:
        async with make(0.05):
            await asyncio.sleep(0)
            value = 7
        await asyncio.sleep(0.1)  # past the old deadline: nothing may cancel us now
        async with make(None):  # no deadline at all
            await asyncio.sleep(0.01)
        return value

    assert asyncio.run(body()) == 7


@pytest.mark.parametrize("make", IMPLEMENTATIONS)
def test_an_outer_cancel_stays_a_cancellation(make):
    async def body() -> str:
        async def inner() -> None:
            async with make(10):
                await asyncio.sleep(10)

        task = asyncio.ensure_future(inner())
        await asyncio.sleep(0.01)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return "cancelled"
        except TimeoutError:
            return "timeout"
        return "finished"

    assert asyncio.run(body()) == "cancelled"


@pytest.mark.parametrize("make", IMPLEMENTATIONS)
def test_errors_from_the_body_pass_through(make):
    async def body() -> None:
        async with make(1):
            raise KeyError("x")

    with pytest.raises(KeyError):
        asyncio.run(body())


@pytest.mark.parametrize("make", IMPLEMENTATIONS)
def test_nested_deadlines_the_inner_one_fires_first(make):
    async def body() -> str:
        async with make(5):
            try:
                async with make(0.01):
                    await asyncio.sleep(10)
            except TimeoutError:
                return "inner"
        return "none"

    assert asyncio.run(body()) == "inner"
