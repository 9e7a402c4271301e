"""The emulation proxies relay bytes faithfully and inject exactly the faults they are asked for."""

from __future__ import annotations

import http.client
import http.server
import threading
from collections.abc import Iterator

import pytest

from benchmarks.netem import FaultProxy, LatencyProxy

PAYLOAD = bytes(range(256)) * 4096  # 1 MiB


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Length", str(len(PAYLOAD)))
        self.end_headers()
        self.wfile.write(PAYLOAD)

    def do_HEAD(self) -> None:  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Length", str(len(PAYLOAD)))
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def origin_port() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _get(port: int, method: str = "GET", connection: http.client.HTTPConnection | None = None) -> bytes:
    conn = connection or http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request(method, "/object")
    response = conn.getresponse()
    body = response.read()
    assert response.status == 200, response.status
    return body


def test_latency_proxy_relays_concurrent_streams_intact(origin_port: int) -> None:
    with LatencyProxy(origin_port, latency_ms=4, per_connection_mb_s=200) as proxy:
        results: list[bytes] = []
        threads = [threading.Thread(target=lambda: results.append(_get(proxy.port))) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(results) == 4 and all(body == PAYLOAD for body in results)


def test_fault_proxy_keeps_connections_alive_and_counts(origin_port: int) -> None:
    with FaultProxy(origin_port, slowdown_every=1, skip_first=1, max_faults=1) as proxy:
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
        assert _get(proxy.port, connection=conn) == PAYLOAD  # skipped
        conn.request("GET", "/object")
        throttled = conn.getresponse()
        assert throttled.status == 503 and b"<Code>SlowDown</Code>" in throttled.read()
        assert _get(proxy.port, "HEAD", connection=conn) == b""  # HEAD is not counted and has no body
        assert _get(proxy.port, connection=conn) == PAYLOAD  # fault budget spent
    assert proxy.counts.requests == 3 and proxy.counts.slowdowns == 1


def test_fault_proxy_drops_mid_body(origin_port: int) -> None:
    with FaultProxy(origin_port, drop_every=1, drop_after_bytes=1000) as proxy:
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
        conn.request("GET", "/object")
        response = conn.getresponse()
        with pytest.raises(http.client.IncompleteRead) as short:
            response.read()
    assert len(short.value.partial) == 1000 and proxy.counts.drops == 1
