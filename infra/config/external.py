"""Stack config: a Helm release the cluster already runs and keeps (`external:` under kueue, monitoring,
gpu.devicePlugin, gpu.dcgmExporter, gpu.efaDevicePlugin and nodes.autoscaler).

On a cluster the stack does not own (cluster.existing, or platform onprem) the platform team may already run Kueue,
the NVIDIA device plugin, kube-prometheus-stack or the cluster-autoscaler. `external` says where and at which chart
version: the stack then installs no second copy (no Helm release of its own, nothing for `destroy` to remove) but
still creates what builds on it (Kueue's flavors and queues in the API version that Kueue serves, the PodMonitor and
PrometheusRule for that Prometheus). Preflight checks the release there runs the declared version."""

from __future__ import annotations

from pydantic import Field

from infra.config.base import DnsLabel, StrictModel

CHART_VERSION = r"^v?\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$"


class ExternalRelease(StrictModel):
    """A Helm release of the chart that the cluster already runs (helm list -A): adopted, never installed, upgraded
    or deleted by the stack."""

    version: str = Field(pattern=CHART_VERSION)
    ("the chart version it runs (helm list -A, the CHART column without the name): what the stack's objects are built "
     "for; preflight FAILs when the release runs another")
    release: DnsLabel | None = None
    """its Helm release name; default: the chart's name (kueue, nvidia-device-plugin, ...)"""
    namespace: DnsLabel | None = None
    """its namespace; default: the section's namespace"""
