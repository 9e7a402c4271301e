"""A small HTTP server on 127.0.0.1 that speaks the real AWS wire protocols for APIs moto does not cover (Service
Quotas values, the Price List API, EKS cluster versions), so boto3 talks to it unmodified through endpoint_url.

JSON protocol services (service-quotas, pricing) are routed by the X-Amz-Target header (`<prefix>.<Operation>`),
EC2's query protocol (a form-encoded POST with `Action=`) by the action (`ec2_actions`, a handler returning
(status, XML text)),
rest-json ones (EKS) by method and path, S3 HeadBucket by path (`heads`). A handler returns (status, body); an
error body is the AWS JSON error shape `{"__type": code, "message": ...}`, sent with the x-amzn-ErrorType header as
AWS does. Requests are recorded so tests
can assert what was asked. Started and stopped by the test that owns it (thread, not process: nothing to kill).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

Handler = Callable[[dict[str, Any]], tuple[int, dict[str, Any]]]


class AwsStub:
    def __init__(self) -> None:
        self.targets: dict[str, Handler] = {}  # "ServiceQuotasV20190624.GetServiceQuota" -> handler(body)
        self.routes: dict[tuple[str, str], Handler] = {}  # ("GET", "/cluster-versions") -> handler(query)
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.heads: dict[str, int] = {}  # rest-xml HEAD (S3 HeadBucket): path -> status, 404 when not listed
        # EC2 query protocol: "DescribeCapacityReservations" -> handler(form fields) -> (status, XML body)
        self.ec2_actions: dict[str, Callable[[dict[str, Any]], tuple[int, str]]] = {}
        stub = self

        class _Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet test output
                return

            def _reply(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.1")
                if status >= 400 and "__type" in body:
                    self.send_header("x-amzn-ErrorType", str(body["__type"]))
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                if self.headers.get("Content-Type", "").startswith("application/x-www-form-urlencoded"):
                    form = {key: values[0] for key, values in parse_qs(raw.decode()).items()}
                    stub.requests.append((f"ec2 {form.get('Action')}", form))
                    action = stub.ec2_actions.get(str(form.get("Action")))
                    status, text = action(form) if action else (400, ec2_error("InvalidAction", "no stub"))
                    data = text.encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "text/xml")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                body = json.loads(raw or b"{}")
                target = self.headers.get("X-Amz-Target", "")
                stub.requests.append((target, body))
                handler = stub.targets.get(target)
                if handler is None:
                    self._reply(400, {"__type": "UnknownOperationException", "message": f"no stub for {target}"})
                    return
                self._reply(*handler(body))

            def do_HEAD(self) -> None:  # noqa: N802 - S3 HeadBucket answers with a status and no body
                path = urlsplit(self.path).path
                stub.requests.append((f"HEAD {path}", {}))
                self.send_response(stub.heads.get(path, 404))
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self) -> None:  # noqa: N802
                parts = urlsplit(self.path)
                query = {key: values if len(values) > 1 else values[0] for key, values in parse_qs(parts.query).items()}
                stub.requests.append((f"GET {parts.path}", query))
                handler = stub.routes.get(("GET", parts.path))
                if handler is None:
                    self._reply(404, {"__type": "NotFoundException", "message": f"no stub for {parts.path}"})
                    return
                self._reply(*handler(query))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> AwsStub:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=10)

    def client(self, service: str, region: str = "us-east-1") -> Any:
        """A boto3 client of `service` that talks to this stub (test credentials)."""
        import boto3

        return boto3.client(service, region_name=region, endpoint_url=self.url, aws_access_key_id="testing",
                            aws_secret_access_key="testing")


def ec2_error(code: str, message: str) -> str:
    """An EC2 query-protocol error document, as EC2 sends it with a 4xx status."""
    return (f"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{code}</Code>"
            f"<Message>{message}</Message></Error></Errors><RequestID>stub</RequestID></Response>")


def without_aws_credentials(monkeypatch: Any, tmp_path: Any) -> None:
    """No AWS credentials anywhere boto3 looks: environment, shared files, profile, instance metadata."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    for name in ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
        monkeypatch.setenv(name, str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
