"""S3 plumbing shared by upload and stage: s3:// URIs, the boto3 client, error wording and retries with backoff."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import boto3
import botocore.exceptions
import urllib3.exceptions
from botocore.config import Config

from workloads.awsenv import configured_region
from workloads.data.format.errors import DataToolError, is_runtime_oserror

T = TypeVar("T")


@dataclass(frozen=True)
class S3Uri:
    bucket: str
    prefix: str  # no leading or trailing slash; "" for the bucket root

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


def parse_s3_uri(text: str) -> S3Uri:
    if not text.startswith("s3://"):
        raise DataToolError(text, "expected an s3://bucket/prefix URI")
    bucket, _, prefix = text[len("s3://"):].partition("/")
    if not bucket:
        raise DataToolError(text, "missing bucket name")
    return S3Uri(bucket=bucket, prefix=prefix.strip("/"))


def make_client(endpoint_url: str | None, max_connections: int, botocore_attempts: int = 1):  # noqa: ANN201
    """An S3 client from the usual boto3 credential chain.

    botocore_attempts=1 leaves retries to `with_retries` (stage), so one policy covers both throttling answers and
    connections dropped mid-body, which botocore cannot retry because they happen after it returned.
    Checksums are only sent or validated when an operation requires them: S3-compatible stores (COS, MinIO
    releases before 2025) reject the newer default aws-chunked CRC uploads; integrity is the manifest's sha256.
    """
    session = boto3.session.Session()
    config = Config(
        max_pool_connections=max_connections,
        retries={"mode": "standard", "total_max_attempts": botocore_attempts},
        connect_timeout=10,
        read_timeout=60,
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        s3={"addressing_style": "path"} if endpoint_url else None,
    )
    return session.client("s3", endpoint_url=endpoint_url, region_name=configured_region(session) or "us-east-1",
                          config=config)


_THROTTLING_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests",
                     "RequestTimeout", "InternalError", "ServiceUnavailable", "503", "500", "502", "504"}
_CREDENTIAL_CODES = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken",
                     "InvalidClientTokenId", "AuthorizationHeaderMalformed"}


class TransientError(Exception):
    """A retryable failure detected by our own checks (short body, checksum mismatch)."""


def error_code(exc: BaseException) -> str | None:
    if isinstance(exc, botocore.exceptions.ClientError):
        return str(exc.response.get("Error", {}).get("Code", "")) or None
    return None


def is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, botocore.exceptions.ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return error_code(exc) in _THROTTLING_CODES or status >= 500 or status == 429
    return isinstance(exc, TransientError | botocore.exceptions.ConnectionError
                      | botocore.exceptions.ResponseStreamingError | botocore.exceptions.IncompleteReadError
                      | urllib3.exceptions.HTTPError | ConnectionError | TimeoutError)


def describe(where: str, exc: BaseException) -> DataToolError:
    """Turn a boto3/botocore failure into the one line a user can act on."""
    if isinstance(exc, DataToolError):
        return exc
    code = error_code(exc)
    if code in ("NoSuchBucket",):
        return DataToolError(where, "bucket does not exist")
    if code in ("NoSuchKey", "404", "NotFound"):
        return DataToolError(where, "object not found")
    if code in _CREDENTIAL_CODES:
        return DataToolError(where, f"credentials rejected ({code})")
    if code == "AccessDenied":
        return DataToolError(where, "access denied (the credentials lack permission on this bucket)")
    if code in ("403", "Forbidden"):  # HEAD answers carry no error code
        return DataToolError(where, "access denied (HTTP 403: credentials rejected or lacking permission)")
    if isinstance(exc, botocore.exceptions.NoCredentialsError):
        return DataToolError(where, "no AWS credentials found (environment, profile, or instance/pod role)")
    if isinstance(exc, botocore.exceptions.EndpointConnectionError):
        return DataToolError(where, f"cannot connect to the endpoint ({exc})", runtime=True)
    if isinstance(exc, botocore.exceptions.ClientError):
        return DataToolError(where, f"{code}: {exc.response.get('Error', {}).get('Message', exc)}", runtime=True)
    if isinstance(exc, OSError):
        return DataToolError(str(exc.filename or where), f"{exc.strerror or exc}", runtime=is_runtime_oserror(exc))
    return DataToolError(where, f"{type(exc).__name__}: {exc}", runtime=True)


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 6
    base_delay_s: float = 0.2
    max_delay_s: float = 10.0

    def delay(self, attempt: int) -> float:
        """Exponential backoff with full jitter, for retry number `attempt` (1-based)."""
        return random.uniform(0, min(self.max_delay_s, self.base_delay_s * 2 ** (attempt - 1)))


def with_retries(
    action: Callable[[], T], where: str, policy: RetryPolicy, on_retry: Callable[[], None] | None = None
) -> T:
    """Run `action`, retrying throttling and dropped connections; raise DataToolError when it cannot succeed.
    `on_retry` is told of every retry (the stager counts them for its metrics)."""
    for attempt in range(1, policy.attempts + 1):
        try:
            return action()
        except Exception as exc:
            if not is_retryable(exc):
                raise describe(where, exc) from exc
            if attempt == policy.attempts:
                reason = error_code(exc) or f"{type(exc).__name__}: {exc}"
                raise DataToolError(where, f"gave up after {attempt} attempts: {reason}", runtime=True) from exc
            if on_retry is not None:
                on_retry()
            time.sleep(policy.delay(attempt))
    raise AssertionError("unreachable")
