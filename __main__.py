"""ml-cluster: load and validate the stack config, build the stack from its components, export outputs."""

import sys

import pulumi

from infra.config import ConfigError, ConfigExit, load_pulumi_config
from infra.config.names import check_stack_name
from infra.config.partial import more_pool_problems
from infra.config.schema import runtime_config_values
from infra.poolplan import plan_node_pools
from infra.stack import build_stack, stack_context

try:
    if check_stack_name(pulumi.get_stack()):  # up front: the stack name is part of every derived name
        raise ConfigError(check_stack_name(pulumi.get_stack()))
    try:
        config = load_pulumi_config()
    except ConfigError as schema_error:  # one schema error must not hide the pools' other problems
        raise ConfigError([*schema_error.problems, *more_pool_problems(
            runtime_config_values(), schema_error, plan_node_pools)]) from None
    outputs = build_stack(config, stack_context(config, pulumi.get_project(), pulumi.get_stack()))
except ConfigError as error:  # reported before any resource is registered
    print("\n".join(error.lines()), file=sys.stderr)
    raise ConfigExit(error) from None

for name, value in outputs.items():
    pulumi.export(name, value)
