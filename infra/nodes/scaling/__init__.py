"""Node scaling: how node pools grow and shrink. cluster-autoscaler today (autoscaler.py: its chart values, IAM,
image tag and the node-template tags that let a pool scale from zero; template.py: what it reads of a node); a
Karpenter module would sit beside it. Its settings are `ml-cluster:nodes` (infra/config/nodes.py)."""
