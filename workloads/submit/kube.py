"""The Kubernetes client layer of `submit`: API clients whose every call has a deadline, and creating, reading and
listing a run's objects. Objects come back in their JSON shape (camelCase keys), which the phase logic reads."""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from pathlib import Path
from typing import Any

from workloads.jobspec import DEFAULT_KIND, KINDS, Controller, controller_of
from workloads.kubeconfig import load_kubernetes_config, resolve_kubeconfig
from workloads.submit.errors import RuntimeFailure, UsageError

DEFAULT_REQUEST_TIMEOUT_S = 30.0
RETRY_FIRST_PAUSE_S = 0.5  # a server error (5xx, 429) is tried again after this, then twice as long each time
RETRY_MAX_PAUSE_S = 8.0
CONNECT_TIMEOUT_S = 10.0
FOLLOW_READ_TIMEOUT_S = 300.0  # logs --follow: a stream silent for this long (or --request-timeout, if longer) ends


def _is_timeout(exc: BaseException) -> bool:
    from urllib3.exceptions import MaxRetryError
    from urllib3.exceptions import TimeoutError as Urllib3Timeout

    if isinstance(exc, MaxRetryError):
        return isinstance(exc.reason, Urllib3Timeout | TimeoutError)
    return isinstance(exc, Urllib3Timeout | TimeoutError)


def _not_found(exc: BaseException) -> bool:
    from kubernetes.client.exceptions import ApiException

    return isinstance(exc, ApiException) and exc.status == 404


def _server_error(exc: BaseException) -> int | None:
    """The status of an answer that says the server failed, not the request (5xx, or 429 Too Many Requests)."""
    from kubernetes.client.exceptions import ApiException

    status = exc.status if isinstance(exc, ApiException) else None
    return status if isinstance(status, int) and (status >= 500 or status == 429) else None


class TimedApi:
    """A kubernetes client API object whose every call carries `_request_timeout` (connect, read), so an API server
    that accepts the connection and never answers cannot hold a command forever; a call that runs out of time is a
    RuntimeFailure naming the API server and the call. A server error (5xx, 429) is tried again, with backoff, for at
    most the same time (`--request-timeout`), then is a RuntimeFailure (exit 1) naming the status: it says nothing
    about the input. Sending a create again is safe: an object it made already answers 409, which callers read as
    "unchanged" (the name holds the spec's hash); a delete sent again answers 404 when the try that answered the
    server error had deleted it: that is done, said on stderr, not an error."""

    def __init__(self, api: Any, server: str, timeout_s: float) -> None:
        self._api = api
        self._server = server
        self._timeout = (min(CONNECT_TIMEOUT_S, timeout_s), timeout_s)
        self._retry_s = timeout_s

    @property
    def api_client(self) -> Any:
        return self._api.api_client

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._api, name)
        if not callable(target):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("_request_timeout", self._timeout)
            started = time.monotonic()
            for attempt in itertools.count(1):
                try:
                    return attempt_call(*args, **kwargs)
                except Exception as exc:
                    status = _server_error(exc)
                    if status is None and attempt > 1 and name.startswith("delete_") and _not_found(exc):
                        # The try that answered a server error had deleted it (an answer lost on the way back).
                        print(f"note: kubernetes API {self._server}: {name}: not found on try {attempt} after a "
                              "server error: an earlier try deleted it", file=sys.stderr)
                        return None
                    if status is None:
                        raise
                    pause = min(RETRY_MAX_PAUSE_S, RETRY_FIRST_PAUSE_S * 2 ** (attempt - 1))
                    waited = time.monotonic() - started
                    if waited + pause > self._retry_s:
                        reason = f"{status} {getattr(exc, 'reason', None) or ''}".rstrip()
                        raise RuntimeFailure(f"kubernetes API {self._server}",
                                             f"{name}: {reason} (a server error; {attempt} tries in {waited:.0f}s, "
                                             f"at most {self._retry_s:g}s: --request-timeout)") from None
                    time.sleep(pause)
            raise AssertionError("unreachable")

        def attempt_call(*args: Any, **kwargs: Any) -> Any:
            from kubernetes.client.exceptions import OpenApiException

            try:
                answer = target(*args, **kwargs)
            except Exception as exc:
                if _is_timeout(exc):
                    raise RuntimeFailure(f"kubernetes API {self._server}",
                                         f"{name}: no answer within {kwargs['_request_timeout'][1]:g}s "
                                         "(--request-timeout)") from None
                if isinstance(exc, ValueError | TypeError | AttributeError | KeyError | RecursionError) \
                        and not isinstance(exc, OpenApiException):  # the client could not read the answer
                    raise RuntimeFailure(f"kubernetes API {self._server}",
                                         f"{name}: the answer is not the Kubernetes object asked for "
                                         f"({_why(exc)})") from None
                raise
            problem = outline_problem(name, answer)
            if problem is not None:
                raise RuntimeFailure(f"kubernetes API {self._server}", f"{name}: the answer is not {problem}")
            return answer

        return call


def _why(exc: BaseException) -> str:
    """A short reason for an answer the client could not read: the first line of a validation error, the type of
    the rest (a RecursionError's text is the same for every too-deep document)."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    first = next((line.strip() for line in str(exc).splitlines()[1:3] if line.strip()), "") if \
        type(exc).__name__ == "ValidationError" else str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {first[:120]}" if first else type(exc).__name__


def outline_problem(call: str, answer: Any) -> str | None:
    """What an answer lacks to be what `call` asks for: a list's items each an object with metadata.name, a read or
    a create an object with metadata.name (typed clients' models and the custom objects API's dicts alike); None
    when it is that, or when the call returns something else (a log, a Status)."""
    if call.endswith("_log") or call.startswith("delete_") or answer is None:
        return None
    document = answer if isinstance(answer, dict) else to_json(answer) if hasattr(answer, "to_dict") else answer
    if not isinstance(document, dict):
        return f"a Kubernetes object (a {type(document).__name__})"

    def named(item: Any) -> bool:
        return isinstance(item, dict) and isinstance(item.get("metadata"), dict) \
            and isinstance(item["metadata"].get("name"), str)

    if call.startswith("list_"):
        items = document.get("items")
        if not isinstance(items, list):
            return "a list of Kubernetes objects (no items list)"
        bad = next((index for index, item in enumerate(items) if not named(item)), None)
        return None if bad is None else f"a list of Kubernetes objects (items[{bad}]: no metadata.name)"
    if call.startswith(("read_", "get_", "create_", "patch_", "replace_")) and not named(document):
        return "a Kubernetes object (no metadata.name)"
    return None


def apis(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    from kubernetes import client

    choice = resolve_kubeconfig(args.kubeconfig, args.stack, os.environ, Path.home())
    load_kubernetes_config(choice, args.context)
    from urllib3.util.retry import Retry

    configuration = client.Configuration.get_default_copy()
    # A read that timed out is not sent again: --request-timeout is the whole wait for an answer, not per attempt.
    configuration.retries = Retry(total=3, connect=3, read=0, status=0, other=0, redirect=3)
    client.Configuration.set_default(configuration)
    server = configuration.host
    timeout = args.request_timeout
    return (TimedApi(client.BatchV1Api(), server, timeout), TimedApi(client.CoreV1Api(), server, timeout),
            TimedApi(client.NetworkingV1Api(), server, timeout))


def to_json(api_object: Any) -> dict[str, Any]:
    from kubernetes.client import ApiClient

    return ApiClient().sanitize_for_serialization(api_object)


# The typed client (its place in apis()' answer) and method that create a built-in object; an object of a kind of
# the kind table that is a custom resource goes through the custom objects API with the table's plural.
_TYPED_CREATE = {("batch/v1", "Job"): (0, "create_namespaced_job"),
                 ("v1", "Service"): (1, "create_namespaced_service"),
                 ("networking.k8s.io/v1", "NetworkPolicy"): (2, "create_namespaced_network_policy")}


# Custom objects a run renders beside its controller object (a TrainJob's TrainingRuntime): created before it (the
# TrainJob names it), as (group, version, plural). Trainer is always the stack's own (no `external`), and every
# kubeflow/trainer v2 release serves v1alpha1 only (v2.3.0 charts/kubeflow-trainer/templates/crd/
# trainer.kubeflow.org_trainingruntimes.yaml:34, one `served: true`), so the version is fixed here.
_PREREQUISITES = {("trainer.kubeflow.org/v1alpha1", "TrainingRuntime"): ("trainer.kubeflow.org", "v1alpha1",
                                                                         "trainingruntimes")}


def custom_objects_api(timeout_s: float) -> Any:
    from kubernetes import client

    return TimedApi(client.CustomObjectsApi(), client.Configuration.get_default_copy().host, timeout_s)


def _creator(manifest: dict[str, Any], typed_clients: tuple[Any, Any, Any], custom: Any) -> Any:
    """The call `(namespace, body)` that creates `manifest`."""
    typed = _TYPED_CREATE.get((manifest["apiVersion"], manifest["kind"]))
    if typed is not None:
        return getattr(typed_clients[typed[0]], typed[1])
    api = custom if custom is not None else custom_objects_api(timeout_of(typed_clients[0]))
    prerequisite = _PREREQUISITES.get((manifest["apiVersion"], manifest["kind"]))
    if prerequisite is not None:
        group, version, plural = prerequisite
        return lambda namespace, body: api.create_namespaced_custom_object(group, version, namespace, plural, body)
    controller = controller_of(manifest)
    if controller is None:
        raise UsageError(f"{manifest['kind'].lower()}/{manifest['metadata']['name']}",
                         f"{manifest['apiVersion']} {manifest['kind']} is not a kind submit creates")
    return lambda namespace, body: api.create_namespaced_custom_object(
        controller.group, controller.version, namespace, controller.plural, body)


def create_manifests(manifests: list[dict[str, Any]], batch: Any, core: Any, networking: Any,
                     custom: Any = None) -> list[str]:
    """Create a run's objects in order (a TrainJob's runtime, then the controller object first of the rest); one that
    exists already is `unchanged` (the name holds the spec's hash: same name, same content)."""
    from kubernetes.client.exceptions import ApiException

    lines = []
    ordered = [m for m in manifests if (m["apiVersion"], m["kind"]) in _PREREQUISITES]
    for manifest in ordered + [m for m in manifests if m not in ordered]:
        namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        create = _creator(manifest, (batch, core, networking), custom)
        try:
            create(namespace, manifest)
            lines.append(f"created {manifest['kind'].lower()}/{name} in {namespace}")
        except ApiException as exc:
            if exc.status != 409:
                raise UsageError(f"{manifest['kind'].lower()}/{name}", f"{exc.status} {exc.reason}") from None
            # Same hash, same content: the run already exists.
            lines.append(f"unchanged {manifest['kind'].lower()}/{name} (already exists)")
    return lines


def run_pods(core: Any, namespace: str, name: str,
             controller: Controller = KINDS[DEFAULT_KIND]) -> list[dict[str, Any]]:
    """The pods of the run `name` (its controller's pod selector)."""
    pods = core.list_namespaced_pod(namespace, label_selector=controller.pod_selector(name))
    return [to_json(pod) for pod in pods.items]


def read_job(batch: Any, namespace: str, name: str) -> dict[str, Any]:
    from kubernetes.client.exceptions import ApiException

    try:
        return to_json(batch.read_namespaced_job(name, namespace))
    except ApiException as exc:
        why = "not found" if exc.status == 404 else f"{exc.status} {exc.reason}"
        raise UsageError(f"job/{name}", why) from None


def get_object(api_client: Any, path: str, path_params: dict[str, str], timeout: tuple[float, float],
               server: str = "kubernetes API", call: str = "get") -> Any:
    """GET a path no typed client covers (discovery, an aggregated API), as JSON; no answer within the read timeout
    is a RuntimeFailure naming `server` and `call`, as in TimedApi."""
    try:
        return _get(api_client, path, path_params, timeout)
    except Exception as exc:
        if _is_timeout(exc):
            raise RuntimeFailure(server, f"{call} {path}: no answer within {timeout[1]:g}s (--request-timeout)"
                                 ) from None
        raise


def _get(api_client: Any, path: str, path_params: dict[str, str], timeout: tuple[float, float]) -> Any:
    """kubernetes >= 33's client (openapi-generator 7) serialises the request first (`param_serialize`) and takes no
    `path_params` in `call_api`; the older one does."""
    if hasattr(api_client, "param_serialize"):
        request = api_client.param_serialize(method="GET", resource_path=path, path_params=path_params,
                                             auth_settings=["BearerToken"])
        response = api_client.call_api(*request, _request_timeout=timeout)
        response.read()
        return api_client.response_deserialize(response_data=response, response_types_map={"200": "object"}).data
    return api_client.call_api(path, "GET", path_params=path_params, response_type="object",
                               auth_settings=["BearerToken"], _return_http_data_only=True, _request_timeout=timeout)


def timeout_of(api: Any) -> float:
    timeout = getattr(api, "_timeout", None)
    return float(timeout[1]) if isinstance(timeout, tuple) else DEFAULT_REQUEST_TIMEOUT_S
