"""httpx transports that hand each request to the gateway's ASGI app in this process
(capmon/gateway/app.py, built ``in_process``), on the engine's loop (capmon/inprocess/home.py),
and stream its answer back message by message.

The request runs through exactly what ``capmon serve`` runs: the request id, the Date and
who-served headers (exchange.py, headers.py), the body checks (bodies.py, fields.py), the
routing and fallbacks, errors in the OpenAI or Anthropic shape, streams chunk by chunk; so
the SDKs raise their own typed exceptions and in-process and gateway behaviour cannot drift.
Only the socket is gone. Every request goes to capmon whatever host its URL names: its path
chooses the API (``/v1/chat/completions``, ``/v1/messages``...).

httpx's own ASGITransport reads the whole answer before it returns, which would turn a
stream into one late block; here the response is returned at its start and its body read
as the app sends it. A caller that closes the response early is a client that went away:
the app hears ``http.disconnect`` and cancels the attempt (capmon/gateway/disconnect.py).
The request's read timeout (the SDKs' ``timeout``) bounds each wait for the start and for
every piece, as a socket's would.

Messages cross from the home loop to the caller as they are sent: into the caller's inbox
on the same loop, through ``call_soon_threadsafe`` into another loop's, or into a thread-safe
queue a sync caller blocks on. The inbox is not bounded: an answer is at most
``client.max_response_bytes`` anyway, and the app never waits for a slow reader.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import queue
from collections.abc import AsyncIterator, Callable, Iterator
from types import ModuleType
from typing import Any

import httpx
from starlette.types import ASGIApp, Message, Scope

from capmon.gateway.disconnect import DEPARTURE, Departure
from capmon.inprocess.home import RUNTIME, Home

log = logging.getLogger("capmon.inprocess")

ORIGIN = "http://capmon.invalid"  # the clients' base URL: .invalid never resolves, so nothing leaves by mistake
_REQUEST = "http.request"
_START = "http.response.start"
_BODY = "http.response.body"


class _End:
    """The app returned (``error``: it raised, or was cancelled)."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException | None) -> None:
        self.error = error


Item = Message | _End


def _scope(request: httpx.Request) -> Scope:
    url = request.url
    raw_path, _, _ = url.raw_path.partition(b"?")
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": url.scheme or "http",
        "path": url.path,
        "raw_path": raw_path,
        "query_string": url.query,
        "root_path": "",
        "headers": [(k.lower(), v) for k, v in request.headers.raw],
        "client": None,
        "server": (url.host or "capmon.invalid", url.port or 80),
        # How the app hears a caller that went away (capmon/gateway/disconnect.py).
        "extensions": {DEPARTURE: Departure()},
    }


def _read_timeout(request: httpx.Request) -> float | None:
    timeout = request.extensions.get("timeout")
    return timeout.get("read") if isinstance(timeout, dict) else None


class _Call:
    """One request on the home loop: the app's run, its receive and send."""

    __slots__ = ("app", "scope", "body", "deliver", "task", "_gone", "_waiter", "_read")

    def __init__(self, app: ASGIApp, scope: Scope, body: bytes, deliver: Callable[[Item], object]) -> None:
        self.app = app
        self.scope = scope
        self.body = body
        self.deliver = deliver  # runs on the home loop: hands one item to the caller
        self.task: asyncio.Task[None] | None = None
        self._gone = False
        self._waiter: asyncio.Future[None] | None = None
        self._read = False

    def start(self, calls: set[asyncio.Task[None]]) -> None:
        """On the home loop; ``calls``: its home's requests in flight (home.Home.calls)."""
        self.task = task = asyncio.get_running_loop().create_task(self.run())
        calls.add(task)
        task.add_done_callback(calls.discard)

    async def run(self) -> None:
        try:
            await self.app(self.scope, self._receive, self._send)
        except asyncio.CancelledError as e:
            self.deliver(_End(e))
            raise
        except Exception as e:
            # What uvicorn would log; the caller sees a broken answer, not a hang.
            log.error("the in-process gateway failed on %s %s: %r", self.scope["method"], self.scope["path"], e)
            self.deliver(_End(e))
        else:
            self.deliver(_End(None))

    async def _receive(self) -> Message:
        if not self._read:
            self._read = True
            return {"type": _REQUEST, "body": self.body, "more_body": False}
        if not self._gone:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return {"type": "http.disconnect"}

    async def _send(self, message: Message) -> None:
        self.deliver(message)

    def disconnect(self) -> None:
        """On the home loop: the caller went away."""
        self._gone = True
        self.scope["extensions"][DEPARTURE].gone()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


# ---------------------------------------------------------------- async


class _Inbox:
    """Items for an async caller, on its own loop."""

    __slots__ = ("items", "loop", "waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.items: collections.deque[Item] = collections.deque()
        self.loop = loop
        self.waiter: asyncio.Future[None] | None = None

    def put(self, item: Item) -> None:
        self.items.append(item)
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def put_from_afar(self, item: Item) -> None:
        """From the home loop in another thread."""
        try:
            self.loop.call_soon_threadsafe(self.put, item)
        except RuntimeError:
            pass  # the caller's loop is closed: nobody is left to read it

    async def get(self, timeout: float | None) -> Item:
        if not self.items:
            self.waiter = self.loop.create_future()
            timer = self.loop.call_later(timeout, _expire, self.waiter) if timeout is not None else None
            try:
                await self.waiter
            finally:
                self.waiter = None
                if timer is not None:
                    timer.cancel()
        return self.items.popleft()


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


def _disconnect_afar(home: Home, call: _Call) -> None:
    try:
        home.loop.call_soon_threadsafe(call.disconnect)
    except RuntimeError:
        pass  # the engine's loop is closed: the call ended with it


def _body_of(item: Message) -> tuple[bytes, bool]:
    """A body message's bytes, and whether more follow."""
    return item.get("body", b""), bool(item.get("more_body", False))


def _whole(items: collections.deque[Item]) -> bytes | None:
    """The whole body when all of it has come already (a plain reply), else None."""
    parts = []
    for m in items:
        if isinstance(m, _End):
            return None  # the app ended before the body's end: the stream says it broke
        if m["type"] == _BODY:
            parts.append(m.get("body", b""))
            if not m.get("more_body", False):
                items.clear()
                return b"".join(parts)
    return None


@functools.cache
def transports(http: ModuleType) -> tuple[type[httpx.BaseTransport], type[httpx.AsyncBaseTransport]]:
    """The sync and async transports for ``http``: httpx, or httpx2 (which the anthropic and
    newer openai SDKs use). The same code; each package's own base classes, since its
    clients check that a response's stream is one of theirs."""

    def broken(request: httpx.Request, why: str) -> Exception:
        exc: Exception = http.RemoteProtocolError(why, request=request)
        return exc

    def failed(item: _End, request: httpx.Request) -> Exception:
        if isinstance(item.error, asyncio.CancelledError):
            return broken(request, "capmon's in-process engine stopped before it answered")
        return broken(request, f"capmon's in-process gateway failed before it answered ({type(item.error).__name__})")

    def unavailable(e: Exception, request: httpx.Request) -> Exception:
        # The SDKs wrap what a transport raises into their connection error; this says why.
        exc: Exception = http.ConnectError(f"capmon's in-process engine is not available: {e}", request=request)
        return exc

    def ended(request: httpx.Request) -> Exception:
        return broken(request, "capmon's in-process gateway ended the answer before its end")

    def _piece(item: Item, request: httpx.Request) -> tuple[bytes, bool]:
        """What one message of the app's answer adds to the body, and whether the body is done
        (a message that is not body adds nothing). The app ending before the body's end is a
        broken answer, for sync and async readers alike."""
        if isinstance(item, _End):
            raise ended(request)
        if item["type"] != _BODY:
            return b"", False
        chunk, more = _body_of(item)
        return chunk, not more

    def timed_out(what: str) -> Exception:
        exc: Exception = http.ReadTimeout(f"capmon's in-process gateway {what} within the read timeout")
        return exc

    def response(start: Message, stream: Any) -> httpx.Response:
        out: httpx.Response = http.Response(
            start["status"], headers=start.get("headers", []), stream=stream, extensions={"http_version": b"HTTP/1.1"}
        )
        return out

    def whole_response(start: Message, whole: bytes) -> httpx.Response:
        """A plain reply that has come whole: a response already read, so the client's own
        read of it (which every SDK makes) returns at once instead of streaming it again."""
        out: httpx.Response = http.Response(
            start["status"], headers=start.get("headers", []), content=whole, extensions={"http_version": b"HTTP/1.1"}
        )
        return out

    class AsyncBody(http.AsyncByteStream):  # type: ignore[misc,name-defined]
        def __init__(
            self, inbox: _Inbox, call: _Call, home: Home, request: httpx.Request, timeout: float | None, near: bool
        ) -> None:
            self._inbox = inbox
            self._call = call
            self._home = home
            self._request = request
            self._timeout = timeout
            self._near = near  # the home loop is the caller's
            self._done = False

        async def __aiter__(self) -> AsyncIterator[bytes]:
            while not self._done:
                try:
                    item = await self._inbox.get(self._timeout)
                except TimeoutError:
                    raise timed_out("sent nothing") from None
                self._done = True  # unless the piece says more follows (an early end raises)
                chunk, self._done = _piece(item, self._request)
                if chunk:
                    yield chunk

        async def aclose(self) -> None:
            if self._done:
                return
            self._done = True
            if self._near:
                self._call.disconnect()
                task = self._call.task
                if task is not None and not task.done():
                    await asyncio.wait([task])  # the attempt's cancellation is done, its slot given back
            else:
                _disconnect_afar(self._home, self._call)

    class AsyncTransport(http.AsyncBaseTransport):  # type: ignore[misc,name-defined]
        """Every request to the process's engine (capmon/inprocess/transport.py)."""

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            try:
                home = await RUNTIME.for_async()
            except Exception as e:
                raise unavailable(e, request) from e
            app = home.app
            assert app is not None
            body = await request.aread()
            loop = asyncio.get_running_loop()
            inbox = _Inbox(loop)
            near = home.loop is loop
            call = _Call(app, _scope(request), body, inbox.put if near else inbox.put_from_afar)
            timeout = _read_timeout(request)
            if near and b'"stream"' not in body:
                return await self._inline(call, inbox, request, timeout)
            if near:
                call.start(home.calls)
            else:
                home.loop.call_soon_threadsafe(call.start, home.calls)
            try:
                while True:
                    item = await inbox.get(timeout)
                    if isinstance(item, _End):
                        raise failed(item, request)
                    if item["type"] == _START:
                        break
            except TimeoutError:
                _abandon(call, home, near)
                raise timed_out("did not answer") from None
            except BaseException:  # cancelled, or failed: the app must hear that nobody waits
                _abandon(call, home, near)
                raise
            whole = _whole(inbox.items)
            if whole is not None:  # a plain reply has come whole: nothing to stream
                return whole_response(item, whole)
            return response(item, AsyncBody(inbox, call, home, request, timeout, near))

        @staticmethod
        async def _inline(call: _Call, inbox: _Inbox, request: httpx.Request, timeout: float | None) -> httpx.Response:
            """A request that cannot stream, on the caller's own loop: the app runs in the
            caller's task (its answer is whole when it returns), with no task of its own."""
            try:
                async with asyncio.timeout(timeout):
                    await call.run()
            except TimeoutError:
                raise timed_out("did not answer") from None
            items = inbox.items
            start = items.popleft() if items else _End(None)
            if isinstance(start, _End) or start["type"] != _START:
                raise failed(start if isinstance(start, _End) else _End(None), request)
            whole = _whole(items)
            if whole is None:
                raise ended(request)
            return whole_response(start, whole)

    class SyncBody(http.SyncByteStream):  # type: ignore[misc,name-defined]
        def __init__(
            self, q: queue.SimpleQueue[Item], call: _Call, home: Home, request: httpx.Request, timeout: float | None
        ) -> None:
            self._q = q
            self._call = call
            self._home = home
            self._request = request
            self._timeout = timeout
            self._done = False

        def __iter__(self) -> Iterator[bytes]:
            while not self._done:
                try:
                    item = self._q.get(timeout=self._timeout)
                except queue.Empty:
                    raise timed_out("sent nothing") from None
                self._done = True  # unless the piece says more follows (an early end raises)
                chunk, self._done = _piece(item, self._request)
                if chunk:
                    yield chunk

        def close(self) -> None:
            if not self._done:
                self._done = True
                _disconnect_afar(self._home, self._call)

    class SyncTransport(http.BaseTransport):  # type: ignore[misc,name-defined]
        """Every request to the process's engine, on its own loop (a background thread
        shared by every thread's sync clients, capmon/inprocess/home.py)."""

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            try:
                home = RUNTIME.for_sync()
            except Exception as e:
                raise unavailable(e, request) from e
            app = home.app
            assert app is not None
            body = request.read()
            q: queue.SimpleQueue[Item] = queue.SimpleQueue()
            call = _Call(app, _scope(request), body, q.put)
            home.loop.call_soon_threadsafe(call.start, home.calls)
            timeout = _read_timeout(request)
            try:
                while True:
                    item = q.get(timeout=timeout)
                    if isinstance(item, _End):
                        raise failed(item, request)
                    if item["type"] == _START:
                        break
            except queue.Empty:
                _disconnect_afar(home, call)
                raise timed_out("did not answer") from None
            except BaseException:
                _disconnect_afar(home, call)
                raise
            return response(item, SyncBody(q, call, home, request, timeout))

    return SyncTransport, AsyncTransport


def _abandon(call: _Call, home: Home, near: bool) -> None:
    if near:
        call.disconnect()
    else:
        _disconnect_afar(home, call)
