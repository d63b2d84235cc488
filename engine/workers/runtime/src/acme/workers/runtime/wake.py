"""The wake-up subscription: one held subscription that wakes the claim loop.

One path per loop (`wake_ups_for`): the storage's own wake-ups (PostgreSQL NOTIFY, sent by
the enqueue's transaction at commit) when it has them and `database_wake_ups` is on, else
`Topics.WORK_AVAILABLE`. A lost subscription is re-established after 0.1 s, doubling to
1 s, and logged once when lost and once when back; the loop polls meanwhile. The same
channels carry an operator's cancel of an item on the lane (`(lane, cancel:<id>)`), handed
to `on_cancel` (the loop's `cancel_held`) instead of waking the claim loop
(docs/decisions/0038).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from functools import partial
from typing import Any, Generic, TypeVar
from uuid import UUID

from pydantic import BaseModel

from acme.infra.topics import Topics, TopicsInterface, WorkAvailablePayload
from acme.om.work import WorkManagerInterface
from acme.om.work.storage import CANCEL_NOTE
from acme.om.work.types.work_item import WorkKind
from acme.workers.runtime.errors import one_line
from acme.workers.runtime.metrics import WorkerMetrics
from acme.workers.runtime.settings import RuntimeSettings
from acme.workers.runtime.state import LOOP_LOGGER, ClaimSignal, LoopState

logger = logging.getLogger(LOOP_LOGGER)

T = TypeVar("T")

_RESUBSCRIBE_FIRST_S = 0.1  # seconds before the first try to resubscribe to wake-ups
_RESUBSCRIBE_CAP_S = 1.0  # seconds: the longest pause between two tries to resubscribe
_SUBSCRIBE_WITHIN_S = 5.0  # seconds a subscription may take to be entered


class WakeUpSubscription(Generic[T]):
    """Holds one wake-up subscription on `channel` (`topic` or `database`) and wakes the
    claim loop (`signal.woken()`) for each message `wanted` takes; `run()` until cancelled.

    `subscribe()` returns the subscription to enter (None: the channel is gone, `run`
    returns). `state.wake_ups_up` and `worker_wake_up_channel_up{channel}` say whether it
    is held. `cancelled` reads the id of the item a message says was cancelled (None for a
    wake-up); such a message goes to `on_cancel`, which the loop sets.
    """

    def __init__(
        self,
        *,
        channel: str,
        subscribe: Callable[[], AbstractAsyncContextManager[AsyncIterator[T]] | None],
        wanted: Callable[[T], bool],
        settings: RuntimeSettings,
        metrics: WorkerMetrics,
        state: LoopState,
        signal: ClaimSignal,
        cancelled: Callable[[T], UUID | None] = lambda _message: None,
    ) -> None:
        self.channel = channel
        self.on_cancel: Callable[[UUID], None] = lambda _item_id: None
        self._subscribe = subscribe
        self._wanted = wanted
        self._cancelled = cancelled
        self._settings = settings
        self._metrics = metrics
        self._state = state
        self._signal = signal

    async def run(self) -> None:
        """Hold the subscription; re-establish it when lost.

        Entering may take `_SUBSCRIBE_WITHIN_S` seconds; once in, the loop wakes (whatever
        was sent while it was away). A subscription that cannot be entered, raises or ends
        is lost: one WARNING, the claim loop polls every `POLL_WHILE_DOWN_S` seconds, and
        the next try follows after 0.1 s, doubling to `_RESUBSCRIBE_CAP_S` (the poll interval
        when shorter), each failed try at DEBUG. The try that succeeds logs one INFO line and
        counts `worker_wake_up_resubscriptions_total{channel}`. A connection that goes silent
        is the subscription's own to find out (a ping or probe with a deadline, then raise).
        """
        channel, signal, state = self.channel, self._signal, self._state
        gauge = self._metrics.wake_up_channel_up.labels(channel=channel)
        gauge.set(0)
        cap = min(_RESUBSCRIBE_CAP_S, self._settings.poll_interval)
        retry = _RESUBSCRIBE_FIRST_S
        lost_at: float | None = None  # time.monotonic() of the loss; None while subscribed
        tries = 0
        while True:
            subscription = self._subscribe()
            if subscription is None:
                return
            try:
                async with contextlib.AsyncExitStack() as stack:
                    async with asyncio.timeout(_SUBSCRIBE_WITHIN_S):
                        messages = await stack.enter_async_context(subscription)
                    state.wake_ups_up = True
                    gauge.set(1)
                    if lost_at is not None:
                        self._metrics.wake_up_resubscriptions.labels(channel=channel).inc()
                        logger.info(
                            "wake-ups (%s) back after %.1f s (%d tries)",
                            channel,
                            time.monotonic() - lost_at,
                            tries + 1,
                        )
                    lost_at, tries, retry = None, 0, _RESUBSCRIBE_FIRST_S
                    signal.woken()  # whatever was enqueued while we were away
                    async for message in messages:
                        if (item_id := self._cancelled(message)) is not None:
                            self.on_cancel(item_id)
                        elif self._wanted(message):
                            signal.woken()
                raise ConnectionError("the subscription ended")
            except Exception as exc:
                error = one_line(exc, 200)
            state.wake_ups_up = False
            gauge.set(0)
            if lost_at is None:
                lost_at = time.monotonic()
                signal.woken()  # the claim loop's wait was set for the long poll: cut it
                logger.warning(
                    "wake-ups (%s) lost (%s); resubscribing every %g s at most, claiming "
                    "every %g s until then",
                    channel,
                    error,
                    cap,
                    state.poll_wait_s(self._settings.poll_interval),
                )
            else:
                tries += 1
                logger.debug("wake-ups (%s) still unavailable (%s)", channel, error)
            await asyncio.sleep(retry)
            retry = min(retry * 2, cap)


def wake_ups_for(
    *,
    settings: RuntimeSettings,
    work: WorkManagerInterface,
    topics: TopicsInterface,
    kinds: Sequence[WorkKind],
    metrics: WorkerMetrics,
    state: LoopState,
    signal: ClaimSignal,
) -> WakeUpSubscription[Any]:
    """The loop's one wake-up path for `settings.lane` and `kinds`: the storage's own
    (`database`) when it has one and `database_wake_ups` is on, else the `WORK_AVAILABLE`
    topic (`topic`). Listening to both would wake the loop twice per enqueue."""
    names = {str(kind) for kind in kinds}
    lane = settings.lane
    if settings.database_wake_ups and work.wake_ups() is not None:

        def note_wanted(note: tuple[str, str]) -> bool:
            return note[0] == lane and note[1] in names

        def note_cancelled(note: tuple[str, str]) -> UUID | None:
            return cancelled_item(lane, *note)

        return WakeUpSubscription(
            channel="database",
            subscribe=work.wake_ups,
            wanted=note_wanted,
            cancelled=note_cancelled,
            settings=settings,
            metrics=metrics,
            state=state,
            signal=signal,
        )

    def message_wanted(message: BaseModel) -> bool:
        return (
            isinstance(message, WorkAvailablePayload)
            and message.lane == lane
            and message.kind in names
        )

    def message_cancelled(message: BaseModel) -> UUID | None:
        if not isinstance(message, WorkAvailablePayload):
            return None
        return cancelled_item(lane, message.lane, message.kind)

    return WakeUpSubscription(
        channel="topic",
        subscribe=partial(topics.subscribe, Topics.WORK_AVAILABLE),
        wanted=message_wanted,
        cancelled=message_cancelled,
        settings=settings,
        metrics=metrics,
        state=state,
        signal=signal,
    )


def cancelled_item(lane: str, note_lane: str, note_kind: str) -> UUID | None:
    """The id of the item a wake-up `(note_lane, note_kind)` says was cancelled on `lane`
    (`note_kind` is `cancel:<item id>`); None for any other wake-up, or one that names no id."""
    if note_lane != lane or not note_kind.startswith(CANCEL_NOTE):
        return None
    try:
        return UUID(note_kind.removeprefix(CANCEL_NOTE))
    except ValueError:
        return None
