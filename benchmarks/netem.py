"""Network emulation on 127.0.0.1 for tests and benchmarks (tc netem is not available on this kernel).

Two proxies, each running its own asyncio loop in a background thread, started and stopped by the caller:

    LatencyProxy(upstream_port, latency_ms=20, per_connection_mb_s=None)
        A TCP proxy that delivers every chunk latency_ms / 2 later in each direction (so a request/response round
        trip gains latency_ms) without limiting throughput, optionally capping each connection's download rate
        (object stores serve one stream at a fraction of what parallel streams get).

    FaultProxy(upstream_port, slowdown_every=3, drop_every=5, corrupt_every=0)
        An HTTP/1.1 proxy that counts GET requests and answers every n-th with 503 SlowDown (S3's throttling
        error; slowdown_status=500: 500 InternalError), drops every m-th connection part-way through the
        response body, and/or flips one body byte;
        skip_first passes the first requests through untouched, max_faults caps the faults injected.

Usage:

    with LatencyProxy(server_port, latency_ms=20) as proxy:
        boto3.client("s3", endpoint_url=proxy.url, ...)

Only 127.0.0.1 is ever bound or dialled.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from benchmarks.processes import stop_process

LOCALHOST = "127.0.0.1"
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CHUNK = 64 * 1024
_SLOWDOWN_BODY = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
                  b"<Message>Please reduce your request rate.</Message><RequestId>netem</RequestId></Error>")
# The answer a "slowdown" fault gives, by status: S3's throttling (503 SlowDown) or its 500 InternalError.
_FAULT_ANSWERS = {503: (b"Slow Down", _SLOWDOWN_BODY),
                  500: (b"Internal Server Error", b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError'
                        b"</Code><Message>We encountered an internal error. Please try again.</Message>"
                        b"<RequestId>netem</RequestId></Error>")}


class _ThreadedProxy:
    """An asyncio server on 127.0.0.1:<free port> run in a daemon thread."""

    def __init__(self, upstream_port: int, upstream_host: str = LOCALHOST) -> None:
        if upstream_host != LOCALHOST:
            raise ValueError(f"upstream_host: only {LOCALHOST} may be proxied, got {upstream_host!r}")
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._tasks: set[asyncio.Task] = set()

    @property
    def url(self) -> str:
        return f"http://{LOCALHOST}:{self.port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    async def _tracked(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._handle(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    def start(self) -> _ThreadedProxy:
        started = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._tracked, LOCALHOST, 0, limit=1 << 20))
            self.port = self._server.sockets[0].getsockname()[1]
            started.set()
            self._loop.run_forever()
            self._loop.close()

        self._thread = threading.Thread(target=run, name=type(self).__name__, daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError(f"{type(self).__name__}: did not start")
        return self

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return

        async def shutdown() -> None:
            assert self._server is not None
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.sleep(0)

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop = None

    def __enter__(self) -> _ThreadedProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LatencyProxy(_ThreadedProxy):
    def __init__(self, upstream_port: int, latency_ms: float, per_connection_mb_s: float | None = None,
                 upstream_host: str = LOCALHOST) -> None:
        super().__init__(upstream_port, upstream_host)
        if latency_ms < 0:
            raise ValueError(f"latency_ms: must be >= 0, got {latency_ms}")
        self.one_way_s = latency_ms / 2000
        self.rate_bytes_s = per_connection_mb_s * 1e6 if per_connection_mb_s else None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        try:
            await asyncio.gather(self._pipe(reader, up_writer, None), self._pipe(up_reader, writer, self.rate_bytes_s))
        finally:
            up_writer.close()

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, rate: float | None) -> None:
        # One queue per direction keeps chunks in order; each is released one_way_s after it arrived, so the
        # delay adds to every round trip without capping bandwidth (up to ~64 MiB in flight).
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(maxsize=1024)

        async def pump() -> None:
            while data := await source.read(_CHUNK):
                await queue.put((time.monotonic() + self.one_way_s, data))
            await queue.put(None)

        pumping = asyncio.ensure_future(pump())
        next_send = 0.0
        try:
            while (item := await queue.get()) is not None:
                due, data = item
                if rate:
                    next_send = max(next_send, due) + len(data) / rate
                    due = next_send
                if (wait := due - time.monotonic()) > 0:
                    await asyncio.sleep(wait)
                sink.write(data)
                await sink.drain()
            with contextlib.suppress(OSError):
                if sink.can_write_eof():
                    sink.write_eof()
        finally:
            pumping.cancel()


@dataclass
class FaultCounts:
    requests: int = 0
    slowdowns: int = 0
    drops: int = 0
    corruptions: int = 0


class FaultProxy(_ThreadedProxy):
    def __init__(self, upstream_port: int, slowdown_every: int = 0, drop_every: int = 0, corrupt_every: int = 0,
                 drop_after_bytes: int = 1024, methods: tuple[str, ...] = ("GET",), skip_first: int = 0,
                 max_faults: int | None = None, upstream_host: str = LOCALHOST, slowdown_status: int = 503) -> None:
        super().__init__(upstream_port, upstream_host)
        self.slowdown_status = slowdown_status  # a key of _FAULT_ANSWERS
        self.slowdown_every = slowdown_every
        self.drop_every = drop_every
        self.corrupt_every = corrupt_every
        self.drop_after_bytes = drop_after_bytes
        self.methods = methods
        self.skip_first = skip_first
        self.max_faults = max_faults
        self.counts = FaultCounts()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            method = head.split(b" ", 1)[0].decode()
            headers = _parse_headers(head)
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            if "chunked" in headers.get("transfer-encoding", ""):
                writer.write(b"HTTP/1.1 501 Not Implemented\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                await writer.drain()
                return
            fault = self._pick_fault(method)
            if fault == "slowdown":
                reason, answer = _FAULT_ANSWERS[self.slowdown_status]
                writer.write(b"HTTP/1.1 %d %s\r\nContent-Type: application/xml\r\n"
                             b"Content-Length: %d\r\n\r\n" % (self.slowdown_status, reason, len(answer)) + answer)
                await writer.drain()
                continue
            if not await self._forward(_with_connection_close(head) + body, writer, fault, method == "HEAD"):
                return

    def _pick_fault(self, method: str) -> str | None:
        if method not in self.methods:
            return None
        self.counts.requests += 1
        number = self.counts.requests - self.skip_first
        injected = self.counts.slowdowns + self.counts.drops + self.counts.corruptions
        if number <= 0 or (self.max_faults is not None and injected >= self.max_faults):
            return None
        if self.slowdown_every and number % self.slowdown_every == 0:
            self.counts.slowdowns += 1
            return "slowdown"
        if self.drop_every and number % self.drop_every == 0:
            self.counts.drops += 1
            return "drop"
        if self.corrupt_every and number % self.corrupt_every == 0:
            self.counts.corruptions += 1
            return "corrupt"
        return None

    async def _forward(self, request: bytes, writer: asyncio.StreamWriter, fault: str | None,
                       head_only: bool) -> bool:
        """Send one request upstream and relay the answer; False when the client connection is finished."""
        up_reader, up_writer = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        try:
            up_writer.write(request)
            await up_writer.drain()
            head = await up_reader.readuntil(b"\r\n\r\n")
            headers = _parse_headers(head)
            status = int(head.split(b" ", 2)[1])
            length = int(headers["content-length"]) if "content-length" in headers else None
            if head_only or status in (204, 304):
                body = b""
            else:
                body = await (up_reader.readexactly(length) if length is not None else up_reader.read())
        finally:
            up_writer.close()
        if fault == "drop" and body:
            writer.write(head + body[: min(self.drop_after_bytes, len(body) - 1)])
            await writer.drain()
            writer.transport.abort()
            return False
        if fault == "corrupt" and body:
            middle = len(body) // 2
            body = body[:middle] + bytes([body[middle] ^ 0xFF]) + body[middle + 1:]
        # The upstream leg was Connection: close; the client's connection stays open when the length is known.
        keep_alive = length is not None or head_only
        writer.write(_without_connection_header(head) + body)
        await writer.drain()
        return keep_alive


def _parse_headers(head: bytes) -> dict[str, str]:
    headers = {}
    for line in head.decode("latin-1").split("\r\n")[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    return headers


def _without_connection_header(head: bytes) -> bytes:
    lines = [line for line in head.split(b"\r\n") if line and not line.lower().startswith(b"connection:")]
    return b"\r\n".join(lines + [b"", b""])


def _with_connection_close(head: bytes) -> bytes:
    lines = [line for line in head.split(b"\r\n") if line and not line.lower().startswith(b"connection:")]
    return b"\r\n".join(lines + [b"Connection: close", b"", b""])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOCALHOST, 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def _child(command: list[str], ready: str) -> Iterator[str]:
    """Start a server process, wait for its output line containing `ready`, stop it (and only it) afterwards."""
    # The proxy runs as `python -m benchmarks.netem`: give the child this checkout on its path, whatever the cwd.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_REPO_ROOT, os.environ.get("PYTHONPATH")]))}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        assert process.stdout is not None
        for line in process.stdout:
            if ready in line:
                threading.Thread(target=process.stdout.read, daemon=True).start()  # keep draining its output
                yield line.strip()
                return
        raise RuntimeError(f"{' '.join(command[:3])}: exited before it was ready")
    finally:
        stop_process(process, 10)


@dataclass(frozen=True)
class SlowS3:
    direct_url: str  # the S3 server itself (for seeding data without the added latency)
    endpoint_url: str  # the same server behind the latency proxy (what the measured clients use)


@contextlib.contextmanager
def local_s3_behind_latency(latency_ms: float, per_connection_mb_s: float | None = None) -> Iterator[SlowS3]:
    """A moto S3 server and a LatencyProxy in front of it, each in its own process on 127.0.0.1 (so neither shares
    a GIL with the client being measured); both are stopped on exit. For benchmarks."""
    server_port = free_port()
    server = [sys.executable, "-m", "benchmarks.s3_server", "-H", LOCALHOST, "-p", str(server_port)]
    proxy = [sys.executable, "-m", "benchmarks.netem", "--upstream-port", str(server_port),
             "--latency-ms", str(latency_ms)]
    if per_connection_mb_s:
        proxy += ["--per-connection-mb-s", str(per_connection_mb_s)]
    with _child(server, "Running on"), _child(proxy, "listening") as ready:
        yield SlowS3(direct_url=f"http://{LOCALHOST}:{server_port}",
                     endpoint_url=f"http://{LOCALHOST}:{int(ready.rsplit(':', 1)[1])}")


def main(argv: list[str] | None = None) -> int:
    """Run a LatencyProxy as its own process (so its CPU use does not share a GIL with the measured client):

    python -m benchmarks.netem --upstream-port 9000 --latency-ms 20 [--per-connection-mb-s 100] [--port 0]
    Prints `listening 127.0.0.1:<port>` once ready; stops on SIGTERM or SIGINT.
    """
    import argparse
    import signal

    parser = argparse.ArgumentParser(prog="python -m benchmarks.netem", description=main.__doc__)
    parser.add_argument("--upstream-port", type=int, required=True)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--per-connection-mb-s", type=float, default=None)
    args = parser.parse_args(argv)
    proxy = LatencyProxy(args.upstream_port, args.latency_ms, args.per_connection_mb_s).start()
    print(f"listening {LOCALHOST}:{proxy.port}", flush=True)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    signal.signal(signal.SIGINT, lambda *_: stopped.set())
    stopped.wait()
    proxy.stop()
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
