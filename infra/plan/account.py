"""Which AWS account the offline plan runs as: the one the stack file pins, so a user's own stack shows their
account in bucket names, the image repository and role ARNs; the fixture's otherwise, said in a note when the file
names another account."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any


def plan_account(values: Mapping[str, Any], fixture_account: str) -> tuple[str, str | None]:
    """(account, note or None): `ml-cluster:accountId` when the stack pins one (a `make new-stack` file does), else
    `fixture_account` (stacks/fixtures/caller_identity.json), with a note if the file's ARNs name another account."""
    pinned = values.get("ml-cluster:accountId")
    if isinstance(pinned, int) and not isinstance(pinned, bool):
        pinned = f"{pinned:012d}"
    if isinstance(pinned, str) and re.fullmatch(r"\d{12}", pinned):
        return pinned, None
    named = sorted(set(re.findall(r"arn:aws:[a-z0-9-]*:[a-z0-9-]*:(\d{12}):", json.dumps(values, default=str)))
                   - {fixture_account})
    if not named:
        return fixture_account, None
    return fixture_account, (f"offline names and ARNs use the fixture account {fixture_account} (stacks/fixtures/"
                             f"caller_identity.json), not {named[0]} that the stack file names: set "
                             "ml-cluster:accountId to plan as your account")
