"""The AWS region a process is configured for, read the way the AWS CLI v2 and the other SDKs read it.

boto3 reads AWS_DEFAULT_REGION and the profile's `region`, but not AWS_REGION, which is what the runbook, the
rendered Jobs (workloads/jobspec/render.py) and most other tools set. Every place this project asks for "the
configured region" goes through `configured_region`: AWS_REGION first, then boto3's own answer.
"""

from __future__ import annotations

import os
from typing import Any


def configured_region(session: Any = None) -> str | None:
    """AWS_REGION, else AWS_DEFAULT_REGION or the profile's region (through `session`, a boto3 Session, or a new
    one); None when neither is set."""
    region = os.environ.get("AWS_REGION", "").strip()
    if region:
        return region
    if session is None:
        import boto3

        session = boto3.session.Session()
    return session.region_name or None
