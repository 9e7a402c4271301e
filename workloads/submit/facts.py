"""Where `submit` finds the cluster's facts: `--facts FILE`; else the ConfigMap the stack publishes in the namespace
(infra/jobfacts.py), read through the kubeconfig's context, so a kubeconfig is all a team member needs; else, for
`--stack S` on a cluster without it (deployed before the ConfigMap existed), the stack output through the Pulumi
CLI when it is installed."""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

from workloads.cluster_facts import FACTS_CONFIG_KEY, FACTS_CONFIG_MAP, ClusterFacts, facts_from_dict
from workloads.kubeconfig import KubeconfigError, load_kubernetes_config, resolve_kubeconfig
from workloads.submit.errors import RuntimeFailure, UsageError
from workloads.submit.inputs import load_facts, stack_facts
from workloads.submit.kube import TimedApi


class FactsUnavailable(UsageError):
    """The cluster publishes no facts in the namespace, or this identity may not read them."""


def gang_timeout(args: argparse.Namespace) -> int | None:
    """Kueue's gang timeout from the published facts, for `status`; None where they cannot be read (the line then
    names the wait without its countdown)."""
    from kubernetes.client.exceptions import ApiException

    try:
        return config_map_facts(args).gang_timeout_seconds
    except (ApiException, KubeconfigError, UsageError, RuntimeFailure, ValueError):
        return None


def config_map_facts(args: argparse.Namespace) -> ClusterFacts:
    """The facts the stack publishes in namespace `args.namespace`, through the kubeconfig's context."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    load_kubernetes_config(resolve_kubeconfig(args.kubeconfig, args.stack, os.environ, Path.home()), args.context)
    server = client.Configuration.get_default_copy().host
    core = TimedApi(client.CoreV1Api(), server, args.request_timeout)
    where = f"configmap {args.namespace}/{FACTS_CONFIG_MAP}"
    try:
        config_map = core.read_namespaced_config_map(FACTS_CONFIG_MAP, args.namespace)
    except ApiException as exc:
        if exc.status == 404:
            raise FactsUnavailable(where, f"not found in the cluster at {server} (the stack publishes it on make up; "
                                          "a team's is in its namespace: -n NAMESPACE), or pass --facts FILE") from None
        if exc.status in (401, 403):
            raise FactsUnavailable(where, f"{'forbidden' if exc.status == 403 else 'unauthorized'}: this identity "
                                          f"may not read ConfigMaps in namespace {args.namespace} (ask for view "
                                          "there, or use -n YOUR_TEAM_NAMESPACE, or pass --facts FILE)") from None
        raise
    text = (config_map.data or {}).get(FACTS_CONFIG_KEY)
    try:
        data = json.loads(text) if isinstance(text, str) else None
        if not isinstance(data, dict):
            raise ValueError(f"no JSON object under {FACTS_CONFIG_KEY}")
        return facts_from_dict(data)
    except (ValueError, RecursionError) as exc:
        raise UsageError(where, f"not cluster facts ({exc}); run make up again") from None


def cluster_facts(args: argparse.Namespace) -> ClusterFacts:
    """--facts FILE; else the ConfigMap; else, with --stack and the Pulumi CLI on PATH, the stack output jobFacts."""
    if args.facts is not None:
        return load_facts(args.facts)
    try:
        return config_map_facts(args)
    except (FactsUnavailable, KubeconfigError):
        if args.stack is not None and shutil.which("pulumi"):
            return stack_facts(args.stack)
        raise
