"""A stand-in for the two Node endpoints the burn-in calls, on 127.0.0.1: GET /api/v1/nodes/NAME and PATCH with
application/json-patch+json (RFC 6902 test/add/replace/remove, applied all-or-nothing; a failed `test` is 422 as
the API server answers it). Every accepted write bumps resourceVersion; `interfere` changes the node once between
a client's read and its patch, as another controller would."""

from __future__ import annotations

import copy
import json
import threading
from http.server import ThreadingHTTPServer
from typing import Any

from tests.jsonhttp import JsonHandler


def _tokens(path: str) -> list[str]:
    return [part.replace("~1", "/").replace("~0", "~") for part in path.split("/")[1:]]


def apply_patch(document: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    result = copy.deepcopy(document)
    for op in ops:
        *parents, last = _tokens(op["path"])
        target: Any = result
        for part in parents:
            target = target[part]
        if op["op"] == "test":
            if target.get(last) != op["value"]:
                raise ValueError(f"test failed at {op['path']}")
        elif op["op"] in ("add", "replace"):
            if op["op"] == "replace" and last not in target:
                raise ValueError(f"replace of a missing member {op['path']}")
            target[last] = op["value"]
        elif op["op"] == "remove":
            del target[last]
        else:
            raise ValueError(f"unsupported op {op['op']}")
    return result


class FakeNodes:
    def __init__(self, nodes: dict[str, dict[str, Any]]) -> None:
        self.nodes = nodes
        self.requests: list[tuple[str, str]] = []
        self.interfere = 0  # bump the node this many times, each right after a GET
        self.token = "burn-in-token"
        owner = self

        class Handler(JsonHandler):
            def _node(self) -> str | None:
                owner.requests.append((self.command, self.path))
                if self.headers.get("Authorization") != f"Bearer {owner.token}":
                    self._answer(401, {"kind": "Status", "code": 401})
                    return None
                name = self.path.removeprefix("/api/v1/nodes/")
                if name not in owner.nodes:
                    self._answer(404, {"kind": "Status", "code": 404, "message": f'nodes "{name}" not found'})
                    return None
                return name

            def do_GET(self) -> None:  # noqa: N802
                name = self._node()
                if name is None:
                    return
                answer = copy.deepcopy(owner.nodes[name])
                if owner.interfere:
                    owner.interfere -= 1
                    owner._bump(name, {"metadata": {"labels": {"topology.kubernetes.io/zone": "us-east-1a"}}})
                self._answer(200, answer)

            def do_PATCH(self) -> None:  # noqa: N802
                name = self._node()
                if name is None:
                    return
                if self.headers.get("Content-Type") != "application/json-patch+json":
                    self._answer(415, {"kind": "Status", "code": 415})
                    return
                ops = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                try:
                    patched = apply_patch(owner.nodes[name], ops)
                except (ValueError, KeyError, TypeError) as exc:
                    self._answer(422, {"kind": "Status", "code": 422, "message": str(exc)})
                    return
                patched["metadata"]["resourceVersion"] = str(int(patched["metadata"]["resourceVersion"]) + 1)
                owner.nodes[name] = patched
                self._answer(200, patched)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _bump(self, name: str, change: dict[str, Any]) -> None:
        node = self.nodes[name]
        node["metadata"]["labels"].update(change["metadata"]["labels"])
        node["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)

    def __enter__(self) -> FakeNodes:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
