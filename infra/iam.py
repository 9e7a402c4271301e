"""IAM documents shared by every component: policy documents, and who may assume a role."""

from __future__ import annotations

import json
from typing import Any


def policy_document(*statements: dict[str, Any]) -> str:
    """An IAM policy document (JSON) of `statements`, in order."""
    return json.dumps({"Version": "2012-10-17", "Statement": list(statements)})


def service_trust_policy(service: str, actions: tuple[str, ...] = ("sts:AssumeRole",)) -> str:
    """A role trust policy for an AWS service principal (eks.amazonaws.com, ec2.amazonaws.com, ...)."""
    return policy_document({"Effect": "Allow", "Principal": {"Service": service}, "Action": list(actions)})


def pod_identity_trust_policy() -> str:
    """Trust for EKS Pod Identity: the agent assumes the role and tags the session with the pod's identity."""
    return service_trust_policy("pods.eks.amazonaws.com", ("sts:AssumeRole", "sts:TagSession"))
