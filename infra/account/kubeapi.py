"""A read-only Kubernetes API reader for preflight: GETs with a deadline, a bearer token, the cluster's CA. For an
existing EKS cluster the token is what `aws eks get-token` prints (a presigned sts:GetCallerIdentity URL that signs
the cluster's name in the x-k8s-aws-id header, prefixed k8s-aws-v1.; aws/aws-cli
awscli/customizations/eks/get_token.py), made from the same boto3 credentials preflight uses: no kubeconfig needed.
"""

from __future__ import annotations

import base64
import binascii
import json
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

MAX_ANSWER_BYTES = 256 << 20  # a list of every Helm release record of a busy cluster stays well under this
PAGE = 500  # items per list call (the API server's `limit`, continued with `continue`)
TOKEN_PREFIX = "k8s-aws-v1."
CLUSTER_NAME_HEADER = "x-k8s-aws-id"


class KubeApiError(Exception):
    """A GET that did not give a JSON answer: `status` is the HTTP status (None: not reached), `why` one line."""

    def __init__(self, status: int | None, why: str):
        self.status, self.why = status, why
        super().__init__(why)


@dataclass(frozen=True)
class KubeApi:
    url: str  # https://<endpoint> (or a stand-in's http://127.0.0.1:PORT)
    token: str
    ca_data: str = ""  # base64 PEM, as DescribeCluster's certificateAuthority.data
    timeout_s: float = 10.0  # each GET
    deadline_s: float = 60.0  # a whole paginated list

    def _context(self) -> ssl.SSLContext | None:
        if not self.url.startswith("https://"):
            return None
        if not self.ca_data:
            return ssl.create_default_context()
        try:
            return ssl.create_default_context(cadata=base64.b64decode(self.ca_data).decode("ascii"))
        except (binascii.Error, UnicodeDecodeError, ssl.SSLError, ValueError) as exc:
            raise KubeApiError(None, f"the cluster's certificate authority is not a PEM certificate ({exc})") from None

    def get(self, path: str, query: dict[str, str] | None = None) -> dict[str, Any]:
        address = self.url.rstrip("/") + path + (f"?{urlencode(query)}" if query else "")
        request = urllib.request.Request(address, headers={"Authorization": f"Bearer {self.token}",
                                                           "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s, context=self._context()) as answer:
                body = answer.read(MAX_ANSWER_BYTES + 1)
        except urllib.error.HTTPError as exc:
            raise KubeApiError(exc.code, f"GET {path}: {exc.code} {_status_message(exc)}") from None
        except (urllib.error.URLError, OSError) as exc:  # refused, no route, TLS, timeout
            reason = getattr(exc, "reason", exc)
            raise KubeApiError(None, f"GET {path}: unreachable: {reason}") from None
        if len(body) > MAX_ANSWER_BYTES:
            raise KubeApiError(200, f"GET {path}: over {MAX_ANSWER_BYTES} bytes")
        try:
            document = json.loads(body)
        except (ValueError, RecursionError):
            raise KubeApiError(200, f"GET {path}: the answer is not the Kubernetes API's JSON") from None
        if not isinstance(document, dict):
            raise KubeApiError(200, f"GET {path}: the answer is not a Kubernetes object")
        return document

    def list_items(self, path: str, label_selector: str) -> list[dict[str, Any]]:
        """Every item of a list, page by page, within deadline_s."""
        items: list[dict[str, Any]] = []
        query = {"labelSelector": label_selector, "limit": str(PAGE)}
        ends = time.monotonic() + self.deadline_s
        while True:
            if time.monotonic() > ends:
                raise KubeApiError(None, f"GET {path}: not listed within {self.deadline_s:.0f} s")
            page = self.get(path, query)
            found = page.get("items")
            if not isinstance(found, list):
                raise KubeApiError(200, f"GET {path}: the answer has no list of items")
            items += [item for item in found if isinstance(item, dict)]
            more = (page.get("metadata") or {}).get("continue") if isinstance(page.get("metadata"), dict) else None
            if not more:
                return items
            query = {**query, "continue": str(more)}


def _status_message(exc: urllib.error.HTTPError) -> str:
    """The API server's Status message (one line), else the HTTP reason."""
    try:
        status = json.loads(exc.read(65536) or b"{}")
        message = status.get("message") if isinstance(status, dict) else None
    except (ValueError, OSError):
        message = None
    return " ".join(str(message or exc.reason).split())


def eks_token(sts: Any, cluster_name: str) -> str:
    """The bearer token `aws eks get-token --cluster-name X` prints, from a boto3 STS client's credentials."""

    def name_the_cluster(request: Any, **_: Any) -> None:
        request.headers[CLUSTER_NAME_HEADER] = cluster_name

    sts.meta.events.register_first("before-sign.sts.GetCallerIdentity", name_the_cluster)
    try:
        url = sts.generate_presigned_url("get_caller_identity", Params={}, ExpiresIn=60, HttpMethod="GET")
    finally:
        sts.meta.events.unregister("before-sign.sts.GetCallerIdentity", name_the_cluster)
    return TOKEN_PREFIX + base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")
