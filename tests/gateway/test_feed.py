"""The event feed behind /capmon/events: numbered events with history, a reader that lags
loses its oldest events (and is told how many), and the publisher never waits."""

from __future__ import annotations

import threading

from capmon.core.types import events as ev
from capmon.gateway.feed import EventFeed


def notice(i: int) -> ev.Notice:
    return ev.Notice(at=float(i), wall=float(i), level="info", message=f"n{i}")


async def test_history_then_live_events_numbered_once() -> None:
    bus = ev.EventBus()
    bus.publish(notice(0))  # before the feed: taken from the bus's own history
    feed = EventFeed(bus, history=10, backlog=100)
    bus.publish(notice(1))
    reader = feed.reader()
    bus.publish(notice(2))
    items, dropped = await reader.take(1.0)
    assert [(seq, e.message) for seq, e in items if isinstance(e, ev.Notice)] == [(1, "n0"), (2, "n1"), (3, "n2")]
    assert dropped == 0
    resumed = feed.reader(since=2)
    assert [seq for seq, _ in (await resumed.take(1.0))[0]] == [3]
    assert (await reader.take(0.01)) == ([], 0)  # nothing new: the keepalive's turn
    feed.close()
    assert reader.closed and (await reader.take(60.0)) == ([], 0)  # closing wakes a waiting reader at once


async def test_a_lagging_reader_loses_its_oldest_events_and_the_publisher_never_waits() -> None:
    bus = ev.EventBus()
    feed = EventFeed(bus, history=50, backlog=100)
    slow = feed.reader()
    for i in range(1000):
        bus.publish(notice(i))
    items, dropped = await slow.take(1.0)
    assert dropped == 900 and [seq for seq, _ in items] == list(range(901, 1001))
    late = feed.reader()
    assert len((await late.take(1.0))[0]) == 50  # the history kept for readers that attach later
    other = threading.Thread(target=lambda: bus.publish(notice(1000)))  # another thread hands it to the loop
    other.start()
    other.join()
    items, _ = await slow.take(1.0)
    assert [seq for seq, _ in items] == [1001]
    feed.drop(slow)
    bus.publish(notice(1001))
    assert (await slow.take(0.01)) == ([], 0)
