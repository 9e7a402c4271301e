"""ml-cluster: load and validate the stack config, build the stack from its components, export outputs."""

import sys

import pulumi

from infra.config import ConfigError, ConfigExit, load_pulumi_config
from infra.stack import build_stack, stack_context

try:
    config = load_pulumi_config()
    outputs = build_stack(config, stack_context(config, pulumi.get_project(), pulumi.get_stack()))
except ConfigError as error:  # reported before any resource is registered
    print("\n".join(error.lines()), file=sys.stderr)
    raise ConfigExit(error) from None

for name, value in outputs.items():
    pulumi.export(name, value)
