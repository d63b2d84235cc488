"""Which host managers the sweep resumes parked records through, and the shapes it refuses.

The optional part of the host contract (docs/host-contract.md, Parked records): a manager
in `Managers` with `async def resume_parked(self, ctx, *, limit) -> int` takes part; a
`resume_parked` of another shape stops the worker at start with the manager named. The same
for the outbox relay's optional `outbox_stats(rctx, *, failing_after)` (Outbox state and
dead letters). And the funnel's optional `pre_ping` keyword, which the worker turns off.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

import pytest

from acme.om.context import OpContext, RequestContext
from acme.om.root import Managers
from acme.workers.runtime.container import (
    HostContractError,
    RuntimeContainer,
    outbox_stats_reader,
    parked_record_resumers,
    pool_options,
)
from acme.workers.runtime.sweep import ParkedRecordsResumer


class _Resumes:
    async def resume_parked(self, ctx: OpContext, *, limit: int) -> int:
        return 0


class _Synchronous:
    def resume_parked(self, ctx: OpContext, *, limit: int) -> int:
        return 0


class _NoLimit:
    async def resume_parked(self, ctx: OpContext) -> int:
        return 0


class _TwoPositional:
    async def resume_parked(self, ctx: OpContext, tenant: str, *, limit: int) -> int:
        return 0


class _MoreRequired:
    async def resume_parked(self, ctx: OpContext, *, limit: int, dry_run: bool) -> int:
        return 0


class _KeywordContext:
    async def resume_parked(self, *, ctx: OpContext, limit: int) -> int:
        return 0


def _traced(method: Callable[..., Awaitable[int]]) -> Callable[..., Awaitable[int]]:
    """A plain decorator, as a host might trace its managers with."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Awaitable[int]:
        return method(*args, **kwargs)

    return wrapper


class _Decorated:
    @_traced
    async def resume_parked(self, ctx: OpContext, *, limit: int) -> int:
        return 0


class _Optional:
    async def resume_parked(self, ctx: OpContext, *, limit: int = 10, dry_run: bool = False) -> int:
        return 0


class _Other:
    async def requeue_stale(self, ctx: OpContext, *, limit: int) -> int:
        return 0


@dataclass(frozen=True)
class _Managers:
    """A stand-in for the host's `Managers`: the discovery reads its fields only."""

    first: object
    second: object
    third: object


def _discover(first: object, second: object, third: object) -> dict[str, ParkedRecordsResumer]:
    return parked_record_resumers(cast(Managers, _Managers(first, second, third)))


def test_every_manager_with_resume_parked_takes_part_in_field_order() -> None:
    one, two = _Resumes(), _Resumes()

    found = _discover(two, _Other(), one)

    assert list(found) == ["first", "third"]
    assert found["first"] is two
    assert found["third"] is one


def test_parameters_with_defaults_beyond_the_contract_are_allowed() -> None:
    optional = _Optional()

    assert _discover(_Other(), optional, _Other()) == {"second": optional}


def test_a_decorated_coroutine_method_is_recognised_through_functools_wraps() -> None:
    decorated: object = _Decorated()  # to mypy, a traced method is not the protocol's

    found = _discover(decorated, _Other(), _Other())

    assert list(found) == ["first"]
    assert found["first"] is decorated


def test_a_host_without_parked_records_has_no_resumer() -> None:
    assert _discover(_Other(), _Other(), object()) == {}


@pytest.mark.parametrize(
    ("manager", "problem"),
    [
        (_Synchronous(), "is not a coroutine function"),
        (_NoLimit(), "takes no keyword parameter `limit`"),
        (_TwoPositional(), "also requires tenant, beside the context and `limit`"),
        (_MoreRequired(), "also requires dry_run, beside the context and `limit`"),
        (_KeywordContext(), "takes no positional parameter for the context"),
    ],
)
def test_a_resume_parked_of_another_shape_is_refused_naming_the_manager(
    manager: object, problem: str
) -> None:
    with pytest.raises(HostContractError) as refused:
        _discover(_Other(), manager, _Resumes())

    assert f"Managers.second.resume_parked {problem}" in str(refused.value)
    assert "async def resume_parked(self, ctx: OpContext, *, limit: int) -> int" in str(
        refused.value
    )


def test_the_hosts_own_managers_meet_the_contract(container: RuntimeContainer) -> None:
    """This host's `Managers`, as built: every `resume_parked` there has the shape (or there
    is none), so `serve` starts."""
    expected = [
        name
        for name, manager in vars(container.managers).items()
        if callable(getattr(manager, "resume_parked", None))
    ]

    assert list(parked_record_resumers(container.managers)) == expected


class _ReportsOutbox:
    async def outbox_stats(self, rctx: RequestContext, *, failing_after: int) -> object:
        return None


class _ReportsOutboxSynchronously:
    def outbox_stats(self, rctx: RequestContext, *, failing_after: int) -> object:
        return None


class _ReportsOutboxWithoutBound:
    async def outbox_stats(self, rctx: RequestContext) -> object:
        return None


def _relay(relay: object) -> object:
    @dataclass(frozen=True)
    class _WithRelay:
        outbox_relay: object

    return outbox_stats_reader(cast(Managers, _WithRelay(relay)))


def test_a_relay_with_outbox_stats_is_read_and_one_without_is_not() -> None:
    relay = _ReportsOutbox()

    assert _relay(relay) is relay
    assert _relay(_Other()) is None


@pytest.mark.parametrize(
    ("relay", "problem"),
    [
        (_ReportsOutboxSynchronously(), "is not a coroutine function"),
        (_ReportsOutboxWithoutBound(), "takes no keyword parameter `failing_after`"),
    ],
)
def test_an_outbox_stats_of_another_shape_is_refused(relay: object, problem: str) -> None:
    with pytest.raises(HostContractError) as refused:
        _relay(relay)

    assert f"Managers.outbox_relay.outbox_stats {problem}" in str(refused.value)
    assert "async def outbox_stats(self, rctx: RequestContext, *, failing_after: int)" in str(
        refused.value
    )


def test_the_hosts_own_relay_meets_the_outbox_contract(container: RuntimeContainer) -> None:
    """This host's relay, as built: its `outbox_stats`, if it has one, has the shape."""
    relay = container.managers.outbox_relay
    expected = relay if callable(getattr(relay, "outbox_stats", None)) else None

    assert outbox_stats_reader(container.managers) is expected


def _offers_the_choice(url: str, *, pool_size: int, pre_ping: bool = True) -> None: ...


def _has_no_choice(url: str, *, pool_size: int) -> None: ...


def test_the_worker_turns_the_pre_ping_off_only_where_the_funnel_offers_it() -> None:
    """`from_url(..., pre_ping=False)` for a funnel whose `from_url` takes the keyword;
    nothing extra for one that does not (its pools keep the host's choice)."""
    assert pool_options(_offers_the_choice) == {"pre_ping": False}
    assert pool_options(_has_no_choice) == {}
