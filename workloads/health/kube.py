"""The two Kubernetes API calls the burn-in makes, from inside its pod: read its node, JSON-patch its node.

The standard library only (the training image carries no Kubernetes client): HTTPS to the in-cluster endpoint,
the service account's CA and token (read for every call: the projected token rotates). Every call has a timeout;
`patch_node` retries conflicts (someone changed the node between read and patch) until its deadline.
"""

from __future__ import annotations

import json
import os
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workloads.noredirect import NoRedirect

ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MAX_NODE_BYTES = 4 * 1024 * 1024
REQUEST_TIMEOUT = 30.0


class KubeError(RuntimeError):
    def __init__(self, status: int | None, message: str) -> None:
        super().__init__(message)
        self.status = status


class InCluster:
    def __init__(self, host: str | None = None, account: Path = ACCOUNT) -> None:
        if host is None:
            service, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            if not service:
                raise KubeError(None, "KUBERNETES_SERVICE_HOST is not set: not running in a pod")
            host = f"https://[{service}]:{port}" if ":" in service else f"https://{service}:{port}"
        self.host = host
        self.account = account
        context = ssl.create_default_context(cafile=str(account / "ca.crt")) if host.startswith("https") else None
        self.opener = urllib.request.build_opener(*([urllib.request.HTTPSHandler(context=context)] if context else []),
                                                  NoRedirect)

    def _request(self, method: str, path: str, body: bytes | None = None,
                 content_type: str | None = None) -> dict[str, Any]:
        token = (self.account / "token").read_text().strip()
        request = urllib.request.Request(self.host + path, data=body, method=method,
                                         headers={"Authorization": f"Bearer {token}", "Accept": "application/json",
                                                  **({"Content-Type": content_type} if content_type else {})})
        try:
            with self.opener.open(request, timeout=REQUEST_TIMEOUT) as response:
                data = response.read(MAX_NODE_BYTES + 1)
        except urllib.error.HTTPError as exc:
            detail = exc.read(2000).decode("utf-8", "replace")
            raise KubeError(exc.code, f"{method} {path}: HTTP {exc.code}: {' '.join(detail.split())[:300]}") from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise KubeError(None, f"{method} {path}: {exc}") from None
        if len(data) > MAX_NODE_BYTES:
            raise KubeError(None, f"{method} {path}: answer larger than {MAX_NODE_BYTES} bytes")
        try:
            document = json.loads(data)
        except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, or nested past the decoder's limit
            raise KubeError(None, f"{method} {path}: answer is not JSON ({type(exc).__name__})") from None
        if not isinstance(document, dict):
            raise KubeError(None, f"{method} {path}: answer is not an object")
        return document

    def get_node(self, name: str) -> dict[str, Any]:
        return self._request("GET", f"/api/v1/nodes/{name}")

    def patch_node(self, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        return self._request("PATCH", f"/api/v1/nodes/{name}", json.dumps(ops).encode(),
                             "application/json-patch+json")


def record(client: InCluster, name: str, build: Callable[[dict[str, Any]], list[dict[str, Any]]],
           deadline_s: float = 300, clock: Callable[[], float] = time.monotonic,
           sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Read the node, build the patch from what was read, apply it; on a conflict (409) or a failed `test` (422)
    read again. Other errors and the deadline raise KubeError."""
    until = clock() + deadline_s
    delay = 1.0
    while True:
        node = client.get_node(name)
        ops = build(node)
        if not ops:
            return node
        try:
            return client.patch_node(name, ops)
        except KubeError as exc:
            if exc.status not in (409, 422) or clock() + delay > until:
                raise
        sleep(delay)
        delay = min(delay * 2, 30.0)
