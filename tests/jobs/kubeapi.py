"""A stand-in Kubernetes API server on 127.0.0.1 for what `python -m workloads.submit` asks: ConfigMaps (read),
Jobs (create, read, delete), Services and NetworkPolicies (create, delete), Pods and Kueue Workloads (list), Kueue's
ClusterQueues and LocalQueues of every namespace (list, as `scripts/verify_stack.py` asks); and for
what preflight asks of an existing cluster: Secrets and ConfigMaps of every namespace, by label selector, page by
page (`limit`/`continue`), 403 to all of it when `forbid_cluster_wide` is set. With `tls` (a server-side
SSLContext holding a certificate, tests/tlscerts.py) it answers https:// like an EKS endpoint.
Objects live in memory by (kind, namespace, name); a create of an existing name is 409, a read of a missing one
404, as the API server answers. Discovery (`GET /apis/<group>`, an APIGroup) answers for the groups in `served`
(Kueue 0.19's by default), and a path in a version of such a group that it does not list is 404, as for a
version a CRD or APIService does not serve; Kueue's visibility API answers `pending` (a PendingWorkloadsSummary
per LocalQueue). `forbidden` namespaces answer 403 to everything (an identity without rights
there), and every request must carry the bearer token. Requests are recorded as (method, path)."""

from __future__ import annotations

import json
import re
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from tests.jsonhttp import JsonHandler

TOKEN = "team-member-token"
_ROUTE = re.compile(r"^/(?:api/v1|apis/(?P<group>[a-z0-9.-]+)/(?P<version>v[0-9a-z]+))/namespaces/(?P<ns>[^/]+)/"
                    r"(?P<plural>[a-z]+)(?:/(?P<name>[^/]+))?$")
_CLUSTER_WIDE = re.compile(r"^/api/v1/(?P<plural>secrets|configmaps)$")
_KUEUE_EVERYWHERE = re.compile(r"^/apis/kueue\.x-k8s\.io/v[0-9a-z]+/(?P<plural>clusterqueues|localqueues)$")
_DISCOVERY = re.compile(r"^/apis/(?P<group>[a-z0-9.-]+)$")
_VERSIONED = re.compile(r"^/apis/(?P<group>[a-z0-9.-]+)/(?P<version>v[0-9a-z]+)/")
_PENDING = re.compile(r"^/apis/visibility\.kueue\.x-k8s\.io/v[0-9a-z]+/namespaces/(?P<ns>[^/]+)/localqueues/"
                      r"(?P<name>[^/]+)/pendingworkloads$")
KUEUE_0_19 = {"kueue.x-k8s.io": ("v1beta2", "v1beta1"), "visibility.kueue.x-k8s.io": ("v1beta2", "v1beta1")}
KUEUE_0_14 = {"kueue.x-k8s.io": ("v1beta1",), "visibility.kueue.x-k8s.io": ("v1beta1",)}
_KINDS = {"secrets": "Secret", "configmaps": "ConfigMap", "jobs": "Job", "services": "Service",
          "networkpolicies": "NetworkPolicy", "pods": "Pod",
          "workloads": "Workload",  # Workload: Kueue's (none here: Kueue has not seen the Job yet)
          "clusterqueues": "ClusterQueue", "localqueues": "LocalQueue"}  # listed cluster-wide (verify_stack)


class FakeApiServer:
    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.forbidden: set[str] = set()
        self.forbid_cluster_wide = False
        self.requests: list[tuple[str, str]] = []
        self.raw: dict[str, tuple[int, str, bytes]] = {}  # path -> (status, content type, body) answered as is
        self.raw_times: dict[str, int] = {}  # path -> how many requests get its raw answer (absent: every request)
        self.lost: dict[str, tuple[int, str, bytes]] = {}  # path -> answered once after the DELETE was done
        self.token: str | None = TOKEN  # the bearer token it takes (None: any)
        self.tokens: list[str] = []  # the Authorization header of each request that got that far
        self.redirects: dict[str, str] = {}  # path -> the Location a 302 answer points to
        self.served: dict[str, tuple[str, ...]] = dict(KUEUE_0_19)  # group -> versions, preferred first
        self.pending: dict[tuple[str, str], dict[str, Any]] = {}  # (namespace, LocalQueue) -> pending workloads
        self._uid = 0
        owner = self

        class Handler(JsonHandler):
            def _status(self, code: int, reason: str, message: str) -> None:
                self._answer(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                                    "reason": reason, "code": code})

            def _raw(self, status: int, content_type: str, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                path = urlparse(self.path).path
                owner.requests.append((method, path))
                if path in owner.redirects:
                    self.send_response(302)
                    self.send_header("Location", owner.redirects[path])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if path in owner.raw:  # an answer that breaks the schema (an HTML page from a proxy, junk)
                    answer = owner.raw[path]
                    if path in owner.raw_times:  # a server error that passes
                        owner.raw_times[path] -= 1
                        if owner.raw_times[path] <= 0:
                            del owner.raw[path], owner.raw_times[path]
                    self._raw(*answer)
                    return
                owner.tokens.append(str(self.headers.get("Authorization")))
                if owner.token is not None and self.headers.get("Authorization") != f"Bearer {owner.token}":
                    self._status(401, "Unauthorized", "Unauthorized")
                    return
                if self._kueue_paths(method, path):
                    return
                every = _CLUSTER_WIDE.match(path) or _KUEUE_EVERYWHERE.match(path)
                if every is not None and method == "GET":
                    self._list_everywhere(every["plural"], parse_qs(urlparse(self.path).query))
                    return
                route = _ROUTE.match(path)
                if route is None or route["plural"] not in _KINDS:
                    self._status(404, "NotFound", f"the server could not find the requested resource ({path})")
                    return
                namespace, plural, name = route["ns"], route["plural"], route["name"]
                kind = _KINDS[plural]
                if namespace in owner.forbidden:
                    self._status(403, "Forbidden", f'{plural} is forbidden: User "member" cannot {method.lower()} '
                                                   f'resource "{plural}" in the namespace "{namespace}"')
                    return
                if method == "GET" and name is None:
                    items = [obj for (k, ns, _), obj in sorted(owner.objects.items()) if k == kind and ns == namespace]
                    self._answer(200, {"kind": f"{kind}List", "apiVersion": "v1", "metadata": {}, "items": items})
                    return
                key = (kind, namespace, name or "")
                if method == "POST":
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                    key = (kind, namespace, body["metadata"]["name"])
                    if key in owner.objects:
                        self._status(409, "AlreadyExists", f'{plural} "{key[2]}" already exists')
                        return
                    owner._uid += 1
                    body["metadata"].update({"uid": f"uid-{owner._uid}", "namespace": namespace,
                                             "creationTimestamp": "2026-11-26T12:00:00Z"})
                    owner.objects[key] = body
                    self._answer(201, body)
                    return
                if key not in owner.objects:
                    self._status(404, "NotFound", f'{plural} "{name}" not found')
                    return
                if method == "DELETE":
                    del owner.objects[key]
                    if path in owner.lost:  # deleted, but the answer that comes back is a server error
                        self._raw(*owner.lost.pop(path))
                        return
                    self._answer(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})
                    return
                self._answer(200, owner.objects[key])

            def _kueue_paths(self, method: str, path: str) -> bool:
                """Discovery, unserved versions and the visibility API; False for any other path."""
                group = _DISCOVERY.match(path) or _VERSIONED.match(path)
                if group is not None and group["group"] in owner.served:
                    versions = owner.served[group["group"]]
                    if group.re is _DISCOVERY:
                        self._answer(200, {"kind": "APIGroup", "apiVersion": "v1", "name": group["group"],
                                           "versions": [{"groupVersion": f"{group['group']}/{v}", "version": v}
                                                        for v in versions],
                                           "preferredVersion": {"groupVersion": f"{group['group']}/{versions[0]}",
                                                                "version": versions[0]}})
                        return True
                    if group["version"] not in versions:
                        self._status(404, "NotFound", "the server could not find the requested resource")
                        return True
                elif _DISCOVERY.match(path):
                    self._status(404, "NotFound", "the server could not find the requested resource")
                    return True
                pending = _PENDING.match(path)
                if pending is not None and method == "GET":
                    summary = owner.pending.get((pending["ns"], pending["name"]))
                    if summary is None:
                        self._status(404, "NotFound", f'localqueues "{pending["name"]}" not found')
                    else:
                        self._answer(200, {"kind": "PendingWorkloadsSummary", **summary})
                    return True
                return False

            def _list_everywhere(self, plural: str, query: dict[str, list[str]]) -> None:
                if owner.forbid_cluster_wide:
                    self._status(403, "Forbidden", f'{plural} is forbidden: User "member" cannot list resource '
                                                   f'"{plural}" in API group "" at the cluster scope')
                    return
                wanted = dict(term.split("=", 1) for term in (query.get("labelSelector") or [""])[0].split(",")
                              if "=" in term)
                items = [obj for (kind, _, _), obj in sorted(owner.objects.items()) if kind == _KINDS[plural]
                         and all((obj["metadata"].get("labels") or {}).get(k) == v for k, v in wanted.items())]
                start = int((query.get("continue") or ["0"])[0])
                limit = int((query.get("limit") or [str(len(items) or 1)])[0])
                page, rest = items[start:start + limit], start + limit < len(items)
                self._answer(200, {"kind": f"{_KINDS[plural]}List", "apiVersion": "v1",
                                   "metadata": {"continue": str(start + limit)} if rest else {}, "items": page})

            def do_GET(self) -> None:  # noqa: N802 - the http.server protocol
                self._handle("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._handle("POST")

            def do_DELETE(self) -> None:  # noqa: N802
                self._handle("DELETE")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:  # the handshake runs in accept(); one that fails is an OSError socketserver drops
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.server.server_address[1]}"

    def add(self, manifest: dict[str, Any]) -> None:
        meta = manifest["metadata"]
        self.objects[(manifest["kind"], meta.get("namespace", ""), meta["name"])] = manifest  # "": cluster-scoped

    def kubeconfig(self, path: Path) -> Path:
        """A kubeconfig whose current context is this server, with a bearer token (no Pulumi, no AWS)."""
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "member",
            "clusters": [{"name": "stand-in", "cluster": {"server": self.url}}],
            "users": [{"name": "member", "user": {"token": TOKEN}}],
            "contexts": [{"name": "member", "context": {"cluster": "stand-in", "user": "member"}}]}))
        return path


@contextmanager
def fake_api_server(tls: ssl.SSLContext | None = None) -> Iterator[FakeApiServer]:
    server = FakeApiServer(tls)
    thread = threading.Thread(target=server.server.serve_forever, args=(0.05,), daemon=True)  # quick shutdown
    thread.start()
    try:
        yield server
    finally:
        server.server.shutdown()
        server.server.server_close()
        thread.join(timeout=10)
