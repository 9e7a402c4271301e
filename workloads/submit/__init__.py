"""Training runs on a provisioned cluster, outside `pulumi up`: render, submit, start, status, watch, logs, delete.

    python -m workloads.submit --stack dev render workloads/jobs/resnet50-s3-copy.yaml
    python -m workloads.submit --stack dev submit workloads/jobs/resnet50-s3-copy.yaml
    python -m workloads.submit --stack dev status resnet50-s3-copy-1a2b3c4d
    python -m workloads.submit --stack dev watch resnet50-s3-copy-1a2b3c4d [--interval 10]  # a line per poll
    python -m workloads.submit --stack dev start resnet50-s3-copy-1a2b3c4d      # a Job the stack created suspended
    python -m workloads.submit --stack dev logs resnet50-s3-copy-1a2b3c4d [--container stage] [--index 1] [--follow]
    python -m workloads.submit --stack dev delete resnet50-s3-copy-1a2b3c4d
    python -m workloads.submit --stack dev pack s3://raw/imagenet/train s3://datasets/imagenet-256 --slices 16 \
        --image-tag 0.1.0 [--render]                  # an Indexed Job of 16 slices + the publish Job

Commands talk to the cluster of the current kubeconfig context (`aws eks update-kubeconfig` is enough; `--stack S`
picks the kubeconfig `make kubeconfig STACK=S` wrote, ~/.kube/ml-S; see workloads.kubeconfig for the order with
--kubeconfig and KUBECONFIG). `render`, `submit` and `pack` read the cluster's ClusterFacts from the ConfigMap the
stack publishes in the namespace (`ml-cluster-job-facts` in `-n`, default training: workloads/submit/facts.py), so
they need no Pulumi state; `--facts FILE` gives them as JSON instead (`pulumi stack output jobFacts --json`).
A spec with `team:` renders in that team's namespace, through its LocalQueue (the facts' `teams`); the other
commands take the namespace with `-n` (`-n team-vision status <job>`).
The phase of a run is derived by `job_phase` from the Job, its Pods and their (init) container states, and on a
stack with Kueue from the Job's Workload (conditions, requeue state) and its position in the queue; it is a pure
function over API objects in their JSON shape (camelCase keys), tested without a cluster.
Progress (epoch, samples/s, data-wait share, ETA, staging) comes from the pods' metrics endpoints, read through
the API server's pod proxy (no port-forward, nothing exposed), and is computed by workloads.progress.

With Kueue, `submit` creates Jobs suspended with the queue label: Kueue unsuspends a Job once its whole gang fits
the quota. The stack creates its Jobs held: suspended, the queue recorded in an annotation but no label, so Kueue
leaves them alone until `start` puts them in their queue (on a stack without Kueue, `start` unsuspends them).

The package: `phase` (the phase of a run: pure functions over API objects), `kube` (the Kubernetes client layer:
clients with deadlines, creating, reading and listing objects), `kueue` (a run's Workload and queue position, in the
API versions the cluster's Kueue serves), `inputs` (spec and facts files, the stack's facts),
`observe` (progress and incidents read through the API: status, watch), `commands` (start, logs, delete) and `cli`
(arguments, exit codes). Each imports only those before it in that list (and `errors`).
"""
