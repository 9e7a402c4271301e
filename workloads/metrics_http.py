"""Serving a Prometheus registry over HTTP, and the port/address settings the trainer and the stager share."""

from __future__ import annotations

import argparse
import os
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

METRICS_ADDR_ENV = "METRICS_ADDR"
# Local by default: a pod sets METRICS_ADDR=0.0.0.0 (the rendered Jobs do, behind their NetworkPolicy).
DEFAULT_METRICS_ADDR = "127.0.0.1"


def metrics_addr() -> str:
    return os.environ.get(METRICS_ADDR_ENV) or DEFAULT_METRICS_ADDR


def port_number(text: str) -> int:
    """argparse type of a metrics port: 1-65535, or 0 for off."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value < 65536:
        raise argparse.ArgumentTypeError(f"must be a TCP port (1-65535) or 0 for off, got {value}")
    return value


class MetricsServer:
    """One registry's /metrics endpoint; close() frees the port (a process that exits on an error must not keep
    it: the Job's next container on the node reuses it)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._server: Any = None

    def serve(self, port: int, addr: str) -> int:
        """Listen on addr:port (0: a free port); returns the port. Raises OSError when it cannot listen."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        self._server = server
        return int(server.server_address[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
