"""What `submit` reads of Kueue: a run's Workload and its place in the queue, in the API versions the cluster's Kueue
serves, as the API server's discovery says (one GET of /apis/<group> per group and process, with a deadline).

The stack installs Kueue 0.19.2, or adopts the cluster's own (kueue.external, 0.13 and later). Their API versions:
- kueue.x-k8s.io (Workloads): v1beta2 from 0.15.0, only v1beta1 before (kubernetes-sigs/kueue v0.15.0
  charts/kueue/templates/crd/kueue.x-k8s.io_workloads.yaml serves both; v0.14.8 and v0.13.4 only v1beta1; the CRD
  fixtures under tests/queueing/kueue_crds/). What is read of a Workload (conditions, admission.clusterQueue,
  requeueState) has the same names in both (v0.19.2 apis/kueue/v1beta1/workload_conversion.go converts only the
  priority class reference, topology assignments and an execution-time counter).
- visibility.kueue.x-k8s.io (the pending-workloads position): an APIService per version, v1beta1 in every chart from
  v0.13.4 (charts/kueue/templates/visibility/apiservice_v1beta1.yaml) and v1beta2 from v0.15.0
  (apiservice_v1beta2.yaml:28,38); PendingWorkloadsSummary has the same fields in both (apis/visibility/v1beta1/
  types.go:66-91, v1beta2/types.go:66-91 at v0.15.0).
The newest version both the server and submit know is used. Where discovery cannot be read (a proxy that answers
something else, a refusal) the Workloads are tried newest first, a 404 meaning "not this version", and the position
is asked in the visibility version that goes with the Workloads' (the same Kueue releases moved both)."""

from __future__ import annotations

from typing import Any

from workloads.jobspec import KUEUE_QUEUE_LABEL
from workloads.submit.errors import RuntimeFailure
from workloads.submit.kube import CONNECT_TIMEOUT_S, DEFAULT_REQUEST_TIMEOUT_S, custom_objects_api, get_object
from workloads.submit.phase import created, queue_position

KUEUE_GROUP = "kueue.x-k8s.io"
VISIBILITY_GROUP = "visibility.kueue.x-k8s.io"
KNOWN_VERSIONS = ("v1beta2", "v1beta1")  # newest first: what submit reads in both groups
# Kueue labels each Workload with the UID of the Job it stands for (pkg/controller/constants/constants.go:43 at
# v0.19.2); the Workload's name is derived from the Job's and is not guessed here.
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"

_served: dict[tuple[str, str], tuple[str, ...] | None] = {}  # (API server, group) -> its versions, once a process


def served_versions(api_client: Any, group: str, timeout_s: float) -> tuple[str, ...] | None:
    """The versions of `group` the API server serves, preferred first (GET /apis/<group>, an APIGroup); () when it
    serves none (404: Kueue is not installed); None when discovery gives no answer to go by (a refusal, a server
    error, an answer that is not an APIGroup). No answer within `timeout_s` is a RuntimeFailure, as for every call."""
    from kubernetes.client.exceptions import ApiException

    server = str(getattr(getattr(api_client, "configuration", None), "host", ""))
    if (server, group) in _served:
        return _served[(server, group)]
    try:
        document = get_object(api_client, f"/apis/{group}", {}, (min(CONNECT_TIMEOUT_S, timeout_s), timeout_s),
                              f"kubernetes API {server}", "discovery")
    except ApiException as exc:
        document = {"versions": []} if exc.status == 404 else None
    except (ValueError, TypeError, RecursionError):  # an answer the client cannot read (JSON that is not)
        document = None
    versions = _versions_of(document)
    _served[(server, group)] = versions
    return versions


def _versions_of(document: Any) -> tuple[str, ...] | None:
    if not isinstance(document, dict) or not isinstance(document.get("versions"), list):
        return None
    listed = [entry.get("version") for entry in document["versions"] if isinstance(entry, dict)]
    preferred = (document.get("preferredVersion") or {}).get("version") if isinstance(
        document.get("preferredVersion"), dict) else None
    ordered = ([preferred] if preferred in listed else []) + [v for v in listed if v != preferred]
    return tuple(v for v in ordered if isinstance(v, str))


def _pick(served: tuple[str, ...] | None) -> tuple[str, ...]:
    """The versions to read in, in order: the newest submit knows that the server serves (unknown: all, newest
    first)."""
    if served is None:
        return KNOWN_VERSIONS
    return tuple(version for version in KNOWN_VERSIONS if version in served)[:1]


def kueue_versions(api_client: Any, timeout_s: float) -> tuple[str, ...]:
    """The kueue.x-k8s.io versions to read in, in order: the one discovery says this Kueue serves (asked once a
    process, within `timeout_s`); every version submit knows, newest first, where discovery cannot be read (a 404
    then means "not this version"); () where the server serves no Kueue. `scripts/verify_stack.py` reads its
    queues in these too."""
    return _pick(served_versions(api_client, KUEUE_GROUP, timeout_s))


def kueue_state(namespace: str, job: dict[str, Any], timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
                ) -> tuple[dict[str, Any] | None, tuple[int, int] | None]:
    """The Job's Workload and, while it is pending, its place in the queue (visibility API; None where the
    caller may not read it, or this Kueue does not serve it)."""
    from kubernetes.client.exceptions import ApiException

    uid = (job.get("metadata") or {}).get("uid")
    if not uid:
        return None, None
    custom = custom_objects_api(timeout_s)
    found, version = None, None
    versions = kueue_versions(custom.api_client, timeout_s)
    for version in versions:
        try:
            found = custom.list_namespaced_custom_object(
                KUEUE_GROUP, version, namespace, "workloads", label_selector=f"{JOB_UID_LABEL}={uid}")
            break
        except ApiException as exc:  # 404: this Kueue does not serve the version (discovery unread)
            if exc.status != 404 or version == versions[-1]:
                raise
    items = (found.get("items") if isinstance(found, dict) else None) or []
    if not items:
        return None, None
    workload = max(items, key=created)
    served = served_versions(custom.api_client, VISIBILITY_GROUP, timeout_s)
    visibility = _pick(served) if served is not None else (str(version),)  # unknown: the Workloads' Kueue's
    return workload, _position(custom.api_client, namespace, job, workload, visibility, timeout_s)


def _position(api_client: Any, namespace: str, job: dict[str, Any], workload: dict[str, Any],
              versions: tuple[str, ...], timeout_s: float) -> tuple[int, int] | None:
    from kubernetes.client.exceptions import ApiException

    if not versions:  # this Kueue serves no visibility version submit reads
        return None
    queue = ((job.get("metadata") or {}).get("labels") or {}).get(KUEUE_QUEUE_LABEL)
    try:
        pending = get_object(
            api_client,
            f"/apis/{VISIBILITY_GROUP}/{versions[0]}/namespaces/{{namespace}}/localqueues/{{name}}/pendingworkloads",
            {"namespace": namespace, "name": str(queue)}, (min(CONNECT_TIMEOUT_S, timeout_s), timeout_s))
    except (ApiException, RuntimeFailure, ValueError, TypeError, RecursionError):
        return None  # no RBAC for the visibility API, not served, slow, an unreadable answer: it is optional
    return queue_position(pending if isinstance(pending, dict) else None, workload["metadata"]["name"])
