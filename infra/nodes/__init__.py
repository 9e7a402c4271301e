"""Everything about nodes, in the order a stack builds them: instance facts (instances.py) -> the pool plan
(poolplan.py) -> the managed node groups and their launch templates (nodepools.py) -> the GPU plumbing that runs
on them (gpu.py: device plugins, DCGM, cluster-autoscaler)."""
