"""moto in server mode on 127.0.0.1, for the tests whose code under test talks to AWS APIs over real HTTP."""

from __future__ import annotations

import contextlib
import json
import socket
import urllib.request
from collections.abc import Iterable, Iterator
from typing import Any

AGENT = "pod-identity-agent"  # the IAM user standing in for the Pod Identity agent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """Start a moto server on a free local port; yields its URL and stops it (only it) afterwards."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def agent_trust(iam: Any) -> str:
    """Create the user standing in for the Pod Identity agent (moto cannot act as pods.eks.amazonaws.com, so test
    roles trust this user instead of the service); the trust policy such a role takes."""
    agent_arn = iam.create_user(UserName=AGENT)["User"]["Arn"]
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"AWS": agent_arn}, "Action": ["sts:AssumeRole", "sts:TagSession"]}]})


# Resetting the shared server drops every account's state; at a load of 15 on two cores it took over 10 s.
RESET_TIMEOUT_S = 60


def reset(url: str) -> None:
    """Clear the server's state (moto's /moto-api/reset), within RESET_TIMEOUT_S."""
    urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset", data=b"", method="POST"),
                           timeout=RESET_TIMEOUT_S).close()


def agent_credentials(iam: Any, url: str, role_arns: Iterable[str]) -> dict[str, str]:
    """The agent may assume `role_arns` and nothing else; its access key, as boto3 keyword arguments. Switches the
    server's IAM enforcement on (moto's reset-auth): from here on every request needs credentials that allow it."""
    iam.put_user_policy(UserName=AGENT, PolicyName="assume", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                "Resource": sorted(role_arns)}]}))
    key = iam.create_access_key(UserName=AGENT)["AccessKey"]
    urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset-auth", data=b"0", method="POST",
                                                  headers={"Content-Type": "text/plain"}), timeout=RESET_TIMEOUT_S)
    return {"aws_access_key_id": key["AccessKeyId"], "aws_secret_access_key": key["SecretAccessKey"]}
