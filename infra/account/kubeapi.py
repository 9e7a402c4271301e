"""A read-only Kubernetes API reader for preflight: GETs with a deadline, a bearer token, the cluster's CA. For an
existing EKS cluster the token is what `aws eks get-token` prints (a presigned sts:GetCallerIdentity URL that signs
the cluster's name in the x-k8s-aws-id header, prefixed k8s-aws-v1.; aws/aws-cli
awscli/customizations/eks/get_token.py), made from the same boto3 credentials preflight uses: no kubeconfig needed.

The token goes only over TLS verified against the cluster's own CA (DescribeCluster's certificateAuthority.data) and
the endpoint's name: plain http:// is refused before anything is sent, except to a loopback address (the tests'
stand-ins, a local `kubectl proxy`), and a redirect is never followed (urllib would resend the Authorization header
to wherever it points, http:// included). A certificate that does not verify is a KubeApiError with `tls` set.
"""

from __future__ import annotations

import base64
import binascii
import http.client
import ipaddress
import json
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

from workloads.noredirect import NoRedirect

MAX_ANSWER_BYTES = 256 << 20  # a list of every Helm release record of a busy cluster stays well under this
PAGE = 500  # items per list call (the API server's `limit`, continued with `continue`)
TOKEN_PREFIX = "k8s-aws-v1."
CLUSTER_NAME_HEADER = "x-k8s-aws-id"


class KubeApiError(Exception):
    """A GET that did not give a JSON answer: `status` is the HTTP status (None: not reached), `why` one line;
    `tls`: the endpoint's certificate did not verify (refused, nothing sent)."""

    def __init__(self, status: int | None, why: str, tls: bool = False):
        self.status, self.why, self.tls = status, why, tls
        super().__init__(why)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class KubeApi:
    url: str  # https://<endpoint> (or a stand-in's http://127.0.0.1:PORT)
    token: str
    ca_data: str = ""  # base64 PEM, as DescribeCluster's certificateAuthority.data (empty: the system's CAs)
    timeout_s: float = 10.0  # each GET
    deadline_s: float = 60.0  # a whole paginated list
    cluster: str = ""  # the cluster's name, for the messages

    def _where(self) -> str:
        return f"cluster {self.cluster} ({self.url})" if self.cluster else self.url

    def _opener(self) -> urllib.request.OpenerDirector:
        parts = urlsplit(self.url)
        if parts.scheme != "https":
            if parts.scheme == "http" and _loopback(parts.hostname or ""):
                return urllib.request.build_opener(NoRedirect)
            raise KubeApiError(None, f"{self._where()}: not https://: the bearer token goes only over TLS")
        if not self.ca_data:
            context = ssl.create_default_context()
        else:
            try:
                context = ssl.create_default_context(cadata=base64.b64decode(self.ca_data).decode("ascii"))
            except (binascii.Error, UnicodeDecodeError, ssl.SSLError, ValueError) as exc:
                why = " ".join(str(exc).split())
                raise KubeApiError(None, f"{self._where()}: its certificate authority (certificateAuthority.data) "
                                         f"is not a base64 PEM certificate ({why})", tls=True) from None
        return urllib.request.build_opener(urllib.request.HTTPSHandler(context=context), NoRedirect)

    def get(self, path: str, query: dict[str, str] | None = None) -> dict[str, Any]:
        address = self.url.rstrip("/") + path + (f"?{urlencode(query)}" if query else "")
        opener = self._opener()
        request = urllib.request.Request(address, headers={"Authorization": f"Bearer {self.token}",
                                                           "Accept": "application/json"})
        try:
            with opener.open(request, timeout=self.timeout_s) as answer:
                body = answer.read(MAX_ANSWER_BYTES + 1)
        except urllib.error.HTTPError as exc:
            if 300 <= exc.code < 400:
                raise KubeApiError(exc.code, f"GET {path}: {exc.code} redirected to {exc.headers.get('Location')}: "
                                             "not followed (the token goes only to the cluster's endpoint)") from None
            raise KubeApiError(exc.code, f"GET {path}: {exc.code} {_status_message(exc)}") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:  # refused, no route, TLS, timeout
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, ssl.SSLError):
                raise KubeApiError(None, f"{self._where()}: refused: {_tls_why(reason)}", tls=True) from None
            why = " ".join(str(reason).split()) or type(reason).__name__
            raise KubeApiError(None, f"GET {path}: unreachable: {why}") from None
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


def _tls_why(exc: ssl.SSLError) -> str:
    """One line: why the endpoint's certificate was not accepted."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        message = exc.verify_message or exc.reason or str(exc)
        if "mismatch" in str(message).lower():
            return f"the API server's certificate does not name the endpoint's host ({message})"
        return ("the API server's certificate is not signed by the cluster's certificate authority "
                f"(certificateAuthority.data): {message}")
    return f"TLS handshake failed: {' '.join(str(exc.reason or exc).split())}"


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
