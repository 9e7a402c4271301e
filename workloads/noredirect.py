"""The redirect refusal every Kubernetes API reader that sends a bearer token uses (preflight's reader in
infra/account/kubeapi.py, the burn-in's calls in workloads/health/kube.py): urllib would send the Authorization
header on to wherever a 3xx's Location points, http:// included."""

from __future__ import annotations

import urllib.request
from typing import Any


class NoRedirect(urllib.request.HTTPRedirectHandler):
    """A 3xx comes back as the HTTPError it is: the bearer token is never sent on to the Location."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None
