"""Values only the user can know (their roles, their VPC, their networks, their account) must not reach a real
`pulumi up` as the examples the committed stack files carry.

The committed stacks plan offline against fixtures in the documentation account 111122223333, so their access
entries, adopted VPC and allowed networks are examples by necessity. Deployed as they are, an access entry would
grant a role in somebody else's account (or fail after the cluster is built), and an example CIDR would lock the
team out of its own API server. So a deploying run refuses every value of these classes, one line each, naming
what to put there; the offline plan accepts them. A `<...>` marker is never a value, offline or not.

Pure functions over the raw config values (the stack file's keys, values already decoded): no Pulumi import.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from infra.config.schema import NAMESPACE

ACCOUNT_KEY = f"{NAMESPACE}accountId"
# Account ids AWS documentation uses in examples: they are never anybody's account.
DOCUMENTATION_ACCOUNTS = ("111122223333", "123456789012", "444455556666", "777788889999", "000000000000")
# RFC 5737 (TEST-NET-1/2/3) and RFC 3849: reserved for documentation, never routed on the internet.
DOCUMENTATION_NETWORKS = tuple(ipaddress.ip_network(net) for net in (
    "192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32"))
_MARKER = re.compile(r"<[^<>]*>")
_ACCOUNT_IN_TEXT = re.compile(r"(?<!\d)(\d{12})(?!\d)")
# Example resource ids in the AWS documentation style: the hex part counts up (vpc-0123456789abcdef0,
# subnet-0a1b2c3d4e5f60001). Real ids are random hex.
_EXAMPLE_ID = re.compile(r"^(vpc|subnet|sg)-(0123456789abcdef|0a1b2c3d4e5f6)[0-9a-f]*$")
_WHERE_TO_LOOK = {"vpc": "aws ec2 describe-vpcs", "subnet": "aws ec2 describe-subnets",
                  "sg": "aws ec2 describe-security-groups"}


def _walk(value: Any, path: str) -> Iterator[tuple[str, str]]:
    """(path, string) for every string leaf, with paths in the error style `key.field[0].field`."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from _walk(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _walk(item, f"{path}[{index}]")
    elif isinstance(value, str):
        yield path, value
    elif isinstance(value, int) and not isinstance(value, bool):  # an unquoted account id read straight from YAML
        yield path, str(value)


def _what_goes_here(path: str) -> str:
    """What the user should write at `path`, in their own terms."""
    if ".accessEntries[" in path:
        return "an IAM role ARN of your own account (aws iam list-roles)"
    if path == ACCOUNT_KEY:
        return "your 12-digit account id (aws sts get-caller-identity --query Account), or remove the key"
    if "Cidrs" in path:
        return "the networks that may reach the API server (your egress: curl https://checkip.amazonaws.com)"
    return "a value from your own account"


def _marker_problem(path: str, text: str) -> tuple[str, str] | None:
    marker = _MARKER.search(text)
    if marker is None:
        return None
    return path, f"{marker.group(0)} is a marker to replace, not a value: put {_what_goes_here(path)} there"


def _documentation_problem(path: str, text: str) -> tuple[str, str] | None:
    example_id = _EXAMPLE_ID.match(text)
    if example_id:
        kind = example_id.group(1)
        return path, (f"{text} is a documentation example id (a placeholder): put your {kind} id "
                      f"({_WHERE_TO_LOOK[kind]})")
    for account in _ACCOUNT_IN_TEXT.findall(text):
        if account in DOCUMENTATION_ACCOUNTS:
            return path, (f"{text} names the documentation account {account} (a placeholder): put "
                          f"{_what_goes_here(path)}")
    if "/" in text or "Cidr" in path:
        try:
            network = ipaddress.ip_network(text, strict=False)
        except ValueError:
            return None
        if any(network.version == doc.version and network.subnet_of(doc)  # type: ignore[arg-type]
               for doc in DOCUMENTATION_NETWORKS):
            return path, (f"{text} is a documentation network (RFC 5737), a placeholder: put "
                          f"{_what_goes_here(path)}")
    return None


def placeholder_problems(values: Mapping[str, Any], deploying: bool,
                         secret_keys: Iterable[str] = ()) -> list[tuple[str, str]]:
    """Every placeholder left in a stack's config, as (config path, why + what to put there).

    `deploying`: a real `pulumi up`/`preview` (documentation values refused too), not the offline plan (only
    `<...>` markers refused). Secret values are never looked at: their text must not reach an error message.
    """
    secret = set(secret_keys)
    problems: list[tuple[str, str]] = []
    for key, value in values.items():
        if key in secret or not (key.startswith(NAMESPACE) or key == "aws:region"):
            continue
        for path, text in _walk(value, key):
            problem = _marker_problem(path, text)
            if problem is None and deploying:
                problem = _documentation_problem(path, text)
            if problem is not None:
                problems.append(problem)
    return problems


def account_problems(pinned: str | None, caller: str | None) -> list[tuple[str, str]]:
    """A stack pinned to an account (`ml-cluster:accountId`) deploys only with that account's credentials: a
    dev stack applied with prod credentials would create a second cluster in the wrong account."""
    if pinned is None or caller is None or pinned == caller:
        return []
    return [(ACCOUNT_KEY, f"the stack is pinned to account {pinned} but the credentials are for account {caller}: "
                          "switch credentials (AWS_PROFILE, aws sso login) or correct the pin")]
