"""A real Prometheus (Debian's package) on 127.0.0.1 for tests: generated config, temporary data dir, stopped by
PID; and a tiny static exporter standing in for dcgm-exporter and kube-state-metrics, which need a GPU node and an
API server."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from benchmarks.processes import stop_process

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def static_exporter(text: str) -> Iterator[int]:
    """Serve `text` as /metrics on 127.0.0.1; yields the port."""
    payload = text.encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            # BrokenPipe: the scraper gave up (scrape timeout on a busy machine); it scrapes again.
            with contextlib.suppress(BrokenPipeError):
                self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:  # 400 on a query that does not parse: the body says why
            body = json.load(exc)
        return body

    def query(self, expr: str) -> dict[str, Any]:
        return self.api("query", query=expr)

    def wait_for(self, expr: str, predicate: Any, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Poll an instant query until predicate(result) holds (scrapes arrive on the server's schedule)."""
        deadline = time.monotonic() + timeout
        result: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            answer = self.query(expr)
            result = answer.get("data", {}).get("result", [])
            if answer.get("status") == "success" and predicate(result):
                return result
            time.sleep(0.1)
        raise AssertionError(f"{expr}: still {result} after {timeout}s")


@contextmanager
def prometheus(tmp: Path, targets: list[dict[str, Any]], rule_files: list[Path], interval: str = "200ms"
               ) -> Iterator[Prometheus]:
    """Start Prometheus scraping `targets` (scrape_config entries) every `interval`; stop it by PID."""
    assert PROMETHEUS is not None
    port = free_port()
    config = {
        "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": targets,
    }
    tmp.mkdir(parents=True, exist_ok=True)
    config_path = tmp / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    log = (tmp / "prometheus.log").open("w")
    process = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config_path}", f"--storage.tsdb.path={tmp / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT)
    server = Prometheus(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"prometheus did not start: {(tmp / 'prometheus.log').read_text()[-2000:]}")
            time.sleep(0.1)
        yield server
    finally:
        stop_process(process, 20)
        log.close()
