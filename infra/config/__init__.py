"""The typed schema of a stack's config: the only place config is parsed.

A stack file (stacks/Pulumi.<stack>.yaml) holds `config:` with keys in namespaces. Everything under `ml-cluster:` is
ours and strict (unknown keys are errors); `aws:region` is read; other namespaces belong to their providers.
Secrets (`ml-cluster:kubeconfig`, `ml-cluster:cosHmacAccessKeyId`, `ml-cluster:cosHmacSecretAccessKey`) must be
Pulumi secrets (`pulumi config set --secret`): a plaintext value in the stack file is an error.
"""

from __future__ import annotations

from infra.config.cluster import ClusterConfig, NetworkConfig, OnpremConfig
from infra.config.errors import ConfigError, ConfigExit
from infra.config.schema import (
    StackConfig,
    load_pulumi_config,
    parse_stack_config,
    read_stack_file,
)

__all__ = [
    "ClusterConfig",
    "ConfigError",
    "ConfigExit",
    "NetworkConfig",
    "OnpremConfig",
    "StackConfig",
    "load_pulumi_config",
    "parse_stack_config",
    "read_stack_file",
]
