"""Loopback network doubles for tests: a free port, a `redis-server` of the test's own, and
a TCP proxy whose connections a test turns half-open.

Test code only, and the standard library only: the engine's tests import it (om/tests is
on the host's pytest path) and so does the template's `scripts/chaos.py`. It lives with the
tests so that no worker image holds it.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Self


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on at the moment of the call."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


_REDIS_FLAGS = ("--bind", "127.0.0.1", "--save", "", "--appendonly", "no")


class RedisServer:
    """A `redis-server` of the test's own on `port` (default: a free one), in `folder`.

    `start()` returns once it accepts connections (at most 5 s, else `AssertionError`);
    `stop()` kills it (SIGKILL: no goodbye to its clients, as in a crash); `restart()` is
    both, on the same port. `url` is its database 0. Never the shared Redis: tests that
    kill, restart or disconnect Redis do it to a server of their own.
    """

    def __init__(self, folder: Path, port: int | None = None) -> None:
        self.folder = folder
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not on PATH (apt-get install redis-server)"
        self._proc = subprocess.Popen(
            [binary, "--port", str(self.port), *_REDIS_FLAGS],
            cwd=self.folder,
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 5
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.02)

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=5)

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()


class _Link:
    """One proxied connection: the client's socket, the server's, what the client sent."""

    def __init__(self, client: asyncio.StreamWriter, server: asyncio.StreamWriter) -> None:
        self.client = client
        self.server = server
        self.sent = bytearray()
        self.silent = False
        self.open = True

    def close(self) -> None:
        for writer in (self.client, self.server):
            writer.close()


class SilencingProxy:
    """A TCP proxy on 127.0.0.1 `port` (default 0: a free one, read back from `port` once
    started) in front of `target_port`, whose connections a test silences.

    `silence(marker)` stops forwarding, both ways, on every open connection whose client
    has sent bytes containing `marker` (`b"SUBSCRIBE"`, `b"LISTEN"`; empty: every open
    connection) and returns how many: their sockets stay open and whatever arrives is
    dropped, as on a half-open connection whose packets the network loses. New connections
    pass as before; one the target refuses (it is down) is closed at once. `start()` and
    `close()`, or `async with SilencingProxy(target_port) as proxy`.
    """

    def __init__(self, target_port: int, port: int = 0) -> None:
        self.target_port = target_port
        self.port = port
        self._server: asyncio.Server | None = None
        self._links: list[_Link] = []

    async def start(self) -> Self:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        """Stop listening and close every connection, silenced ones included."""
        if self._server is not None:
            self._server.close()
        for link in self._links:
            link.close()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self.close()

    def silence(self, marker: bytes = b"") -> int:
        """Silence every open connection whose client sent `marker`; how many it silenced."""
        chosen = [
            link for link in self._links if link.open and not link.silent and marker in link.sent
        ]
        for link in chosen:
            link.silent = True
        return len(chosen)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection(
                "127.0.0.1", self.target_port
            )
        except OSError:
            writer.close()
            return
        link = _Link(writer, server_writer)
        self._links.append(link)
        await asyncio.gather(
            self._pump(link, reader, server_writer, from_client=True),
            self._pump(link, server_reader, writer, from_client=False),
            return_exceptions=True,
        )
        link.open = False
        if not link.silent:  # a long run opens many: keep only those a test may still close
            self._links.remove(link)

    @staticmethod
    async def _pump(
        link: _Link,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        from_client: bool,
    ) -> None:
        try:
            while data := await reader.read(65536):
                if from_client:
                    link.sent += data
                if not link.silent:
                    writer.write(data)
                    await writer.drain()
        finally:
            if not link.silent:
                writer.close()
