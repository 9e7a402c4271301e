"""The GPU node burn-in: what the health-check DaemonSet (infra/nodes/burnin.py) runs on every new GPU node.

- `dcgm`: reads `dcgmi diag -j` output (DCGM 4's JSON) into findings;
- `gpucheck`: the GPU memory/compute check and the NCCL all-reduce inside the node (one process per GPU, torchrun);
- `efa`: the EFA interfaces the node shows, and whether libfabric's EFA provider opens them;
- `verdict`: the pure decision (passed, or failed with the reasons) and the node patch that records it;
- `kube`: the two API calls the reporter makes (read its node, patch its node), with deadlines;
- `__main__`: the container commands (`plan`, `efa`, `report`).

Never imports infra or pulumi: it runs inside the cluster, from the training image.
"""
