"""Policy as code: the rules protecting data, money and security, as pure functions over a stack's resources.

`infra.policy.plan` is the resource shape the rules read (built from the offline plan JSON or from
CrossGuard's arguments), `infra.policy.rules` holds the policies, and `infra/policy/pack/` is the CrossGuard
policy pack that adapts pulumi_policy to them. Nothing here imports pulumi or pulumi_policy: the pack runs in
its own virtualenv.
"""
