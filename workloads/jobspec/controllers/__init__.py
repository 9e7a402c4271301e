"""Controller wrappers: each turns the pod template (workloads.jobspec.pod) into the objects of one controller kind.

One module per kind, each with a `gang_address(run_name, namespace)` and a `wrap(pod)`; the kind table
(workloads.jobspec.kinds) lists them. Nothing here builds a pod: a wrapper adds only what its controller owns
(completions, failure and success policies, the headless Service, the Kueue metadata).
"""
