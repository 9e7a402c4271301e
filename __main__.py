"""ml-cluster: load and validate the stack config, build the stack from its components, export outputs."""

import sys

import pulumi
import pulumi_aws as aws

from infra.config import ConfigError, ConfigExit, load_pulumi_config
from infra.config.names import check_stack_name
from infra.config.nodes import renamed_key_notes
from infra.config.partial import more_pool_problems, more_stack_problems
from infra.config.placeholders import account_problems, placeholder_problems
from infra.config.schema import runtime_config_values, runtime_secret_keys
from infra.facts import stack_facts
from infra.nodes.poolplan import plan_node_pools
from infra.stack import build_stack, stack_context

# The offline plan (infra.plan.engine) runs this file with OFFLINE_PLAN = True in its globals; the Pulumi CLI never
# does, so a real `pulumi up`/`preview` is always a deploying run.
DEPLOYING = not globals().get("OFFLINE_PLAN", False)

try:
    if check_stack_name(pulumi.get_stack()):  # up front: the stack name is part of every derived name
        raise ConfigError(check_stack_name(pulumi.get_stack()))
    raw = runtime_config_values()
    # Values only the user can know, left as the examples' placeholders: refused before anything else is looked up.
    placeholders = placeholder_problems(raw, DEPLOYING, runtime_secret_keys())
    try:
        config = load_pulumi_config()
    except ConfigError as schema_error:  # one schema error must not hide the pools' other problems
        raise ConfigError([*placeholders, *schema_error.problems,
                           *more_pool_problems(raw, schema_error, plan_node_pools),
                           *more_stack_problems(raw, schema_error, lambda partial: stack_facts(
                               partial, stack_context(partial, pulumi.get_project(), pulumi.get_stack())))]) from None
    if placeholders:
        raise ConfigError(placeholders)
    for note in renamed_key_notes(raw):  # an old spelling still read: say the new one
        print(f"note: {note}", file=sys.stderr)
    if DEPLOYING and config.platform == "eks" and config.account_id is not None:
        problems = account_problems(config.account_id, aws.get_caller_identity().account_id)
        if problems:
            raise ConfigError(problems)
    outputs = build_stack(config, stack_context(config, pulumi.get_project(), pulumi.get_stack()))
except ConfigError as error:  # reported before any resource is registered
    print("\n".join(error.lines()), file=sys.stderr)
    raise ConfigExit(error) from None

for name, value in outputs.items():
    pulumi.export(name, value)
