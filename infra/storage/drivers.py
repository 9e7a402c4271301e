"""Storage drivers. EKS: the EBS, EFS, FSx for Lustre and Mountpoint-for-S3 CSI add-ons plus the Pod Identity
agent, each driver that calls AWS with an IAM role that Pod Identity hands to its service account, scoped to this
stack's file system and buckets (the FSx driver only mounts the stack's file system: no role).
Other clusters: the chosen COS driver chart (IBM s3fs flex plugin or csi-s3) and csi-driver-nfs,
pinned."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.config.addons import (
    EBS_CSI_DRIVER,
    EFS_CSI_DRIVER,
    FSX_CSI_DRIVER,
    MOUNTPOINT_S3_CSI_DRIVER,
    POD_IDENTITY_AGENT,
    storage_addons,
)
from infra.config.storage import CosConfig, StorageConfig
from infra.context import ClusterInfo, StackContext
from infra.iam import pod_identity_trust_policy, policy_document

ADDON_NAMESPACE = "kube-system"
# Service accounts the EKS add-ons run their AWS-calling pods under (add-on docs; Mountpoint needs driver v2+
# for Pod Identity).
EFS_SERVICE_ACCOUNTS = ("efs-csi-controller-sa", "efs-csi-node-sa")
EBS_SERVICE_ACCOUNTS = ("ebs-csi-controller-sa",)
MOUNTPOINT_SERVICE_ACCOUNTS = ("s3-csi-driver-sa",)
EBS_MANAGED_POLICY = "arn:aws:iam::aws:policy/service-role/AmazonEBSCSIDriverPolicy"
EFS_CLUSTER_TAG = "efs.csi.aws.com/cluster"


@dataclass(frozen=True)
class HelmChart:
    chart: str
    version: str
    repo: str
    namespace: str


IBM_COS_CHART = HelmChart(
    "ibm-object-storage-plugin",
    "2.2.58",
    "https://raw.githubusercontent.com/IBM/charts/master/repo/ibm-helm",
    "ibm-object-s3fs",
)
CSI_S3_CHART = HelmChart("csi-s3", "0.43.7", "https://yandex-cloud.github.io/k8s-csi-s3/charts", "csi-s3")
NFS_CHART = HelmChart(
    "csi-driver-nfs",
    "4.13.4",
    "https://raw.githubusercontent.com/kubernetes-csi/csi-driver-nfs/master/charts",
    "kube-system",
)


def efs_driver_policy(file_system_arn: str) -> str:
    """AWS's managed AmazonEFSCSIDriverPolicy, statement for statement, plus mounting this file system.

    CreateAccessPoint and TagResource are authorized against the new access point, whose ARN does not exist
    before the call, so the managed policy grants them on `*` and scopes them with conditions: the request must
    carry the driver's cluster tag and no other tag key; TagResource only as part of CreateAccessPoint; delete
    only access points that carry the tag. (Scoping CreateAccessPoint to the file-system ARN denies dynamic
    provisioning.) Reference: AmazonEFSCSIDriverPolicy v1 as moto 5.2.5 ships it
    (moto/iam/aws_managed_policies.py, "AmazonEFSCSIDriverPolicy").
    """
    cluster_tag = {
        "ForAllValues:StringEquals": {"aws:TagKeys": EFS_CLUSTER_TAG},
        "Null": {f"aws:RequestTag/{EFS_CLUSTER_TAG}": "false"},
    }
    return policy_document(
        {
            "Sid": "AllowDescribe",
            "Effect": "Allow",
            "Resource": "*",
            "Action": [
                "elasticfilesystem:DescribeAccessPoints",
                "elasticfilesystem:DescribeFileSystems",
                "elasticfilesystem:DescribeMountTargets",
                "ec2:DescribeAvailabilityZones",
            ],
        },
        {
            "Sid": "AllowCreateAccessPoint",
            "Effect": "Allow",
            "Resource": "*",
            "Action": ["elasticfilesystem:CreateAccessPoint"],
            "Condition": cluster_tag,
        },
        {
            "Sid": "AllowTagNewAccessPoints",
            "Effect": "Allow",
            "Resource": "*",
            "Action": ["elasticfilesystem:TagResource"],
            "Condition": {
                **cluster_tag,
                "StringEquals": {"elasticfilesystem:CreateAction": "CreateAccessPoint"},
            },
        },
        {
            "Sid": "AllowDeleteAccessPoint",
            "Effect": "Allow",
            "Resource": "*",
            "Action": ["elasticfilesystem:DeleteAccessPoint"],
            "Condition": {"Null": {f"aws:ResourceTag/{EFS_CLUSTER_TAG}": "false"}},
        },
        {
            "Sid": "Mount",
            "Effect": "Allow",
            "Resource": file_system_arn,
            "Action": ["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"],
            "Condition": {"Bool": {"elasticfilesystem:AccessedViaMountTarget": "true"}},
        },
    )


def mountpoint_driver_policy(bucket_arns: Sequence[str], kms_key_arns: Sequence[str] = ()) -> str:
    """Read-only access to the stack's dataset buckets (the PVs are mounted read-only)."""
    statements: list[dict] = [
        {"Sid": "List", "Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": sorted(bucket_arns)},
        {
            "Sid": "Read",
            "Effect": "Allow",
            "Action": ["s3:GetObject"],
            "Resource": [f"{arn}/*" for arn in sorted(bucket_arns)],
        },
    ]
    if kms_key_arns:
        statements.append(
            {"Sid": "Decrypt", "Effect": "Allow", "Action": ["kms:Decrypt"], "Resource": sorted(kms_key_arns)}
        )
    return policy_document(*statements)


def ebs_kms_policy(kms_key_arn: str) -> str:
    """The EBS CSI driver's extra permissions for volumes encrypted with a customer key."""
    return policy_document(
        {
            "Effect": "Allow",
            "Resource": kms_key_arn,
            "Action": ["kms:CreateGrant", "kms:ListGrants", "kms:RevokeGrant"],
            "Condition": {"Bool": {"kms:GrantIsForAWSResource": "true"}},
        },
        {
            "Effect": "Allow",
            "Resource": kms_key_arn,
            "Action": [
                "kms:Encrypt",
                "kms:Decrypt",
                "kms:ReEncrypt*",
                "kms:GenerateDataKey*",
                "kms:DescribeKey",
            ],
        },
    )


@dataclass(frozen=True)
class EksStorageDriversArgs:
    config: StorageConfig
    cluster: ClusterInfo
    file_system_arn: pulumi.Input[str] | None = None
    dataset_bucket_arns: Sequence[pulumi.Input[str]] = ()
    wait_for: Sequence[pulumi.Resource] = ()  # node groups: an add-on is ACTIVE only once its pods run


class EksStorageDrivers(pulumi.ComponentResource):
    """Attributes: addons by add-on name (Kubernetes objects that a driver provisions must depend on it)."""

    def __init__(self, ctx: StackContext, args: EksStorageDriversArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ml-cluster:infra:EksStorageDrivers", ctx.name("storage", "drivers"), None, opts)
        self._ctx = ctx
        self._args = args
        self.addons: dict[str, aws.eks.Addon] = {}
        # The one list preflight checks too, less the add-ons the existing cluster keeps (storage.externalAddons):
        # for those the stack makes neither the add-on nor its role and Pod Identity association.
        wanted = [name for name in storage_addons(args.config) if name not in args.config.external_addons]
        agent = self._addon(POD_IDENTITY_AGENT, []) if POD_IDENTITY_AGENT in wanted else None
        bucket_kms_keys = sorted({bucket.kms_key_arn for bucket in args.config.buckets if bucket.kms_key_arn})

        if EBS_CSI_DRIVER in wanted:
            ebs_policies: list[pulumi.Input[str]] = []
            if args.config.gp3 is not None and args.config.gp3.kms_key_arn is not None:
                ebs_policies.append(ebs_kms_policy(args.config.gp3.kms_key_arn))
            ebs_role = self._role("ebs", ebs_policies, managed=[EBS_MANAGED_POLICY])
            self._addon(EBS_CSI_DRIVER, self._associate("ebs", ebs_role, EBS_SERVICE_ACCOUNTS), agent)

        if EFS_CSI_DRIVER in wanted:
            if args.file_system_arn is None:
                raise ValueError("storage.efs: the EFS driver's role needs the file system's ARN")
            efs_role = self._role("efs", [pulumi.Output.from_input(args.file_system_arn).apply(efs_driver_policy)])
            self._addon(EFS_CSI_DRIVER, self._associate("efs", efs_role, EFS_SERVICE_ACCOUNTS), agent)

        if FSX_CSI_DRIVER in wanted:
            # Static provisioning only (the stack creates the file system): the driver mounts, it makes no AWS
            # calls, so it gets no role.
            self._addon(FSX_CSI_DRIVER, [], agent)

        if MOUNTPOINT_S3_CSI_DRIVER in wanted:
            mountpoint_associations: list[pulumi.Resource] = []
            if args.dataset_bucket_arns:
                policy = pulumi.Output.all(*args.dataset_bucket_arns).apply(
                    lambda arns: mountpoint_driver_policy(arns, bucket_kms_keys)
                )
                mountpoint_role = self._role("mountpoint-s3", [policy])
                mountpoint_associations = self._associate("mountpoint-s3", mountpoint_role,
                                                          MOUNTPOINT_SERVICE_ACCOUNTS)
            self._addon(MOUNTPOINT_S3_CSI_DRIVER, mountpoint_associations, agent)
        self.register_outputs({"addons": sorted(self.addons)})

    def _role(self, driver: str, inline_policies: list[pulumi.Input[str]], managed: Sequence[str] = ()) -> aws.iam.Role:
        ctx = self._ctx
        role = aws.iam.Role(
            ctx.name("storage", f"{driver}-csi-role"),
            assume_role_policy=pod_identity_trust_policy(),
            description=f"{driver} CSI driver of {ctx.project}/{ctx.stack} (EKS Pod Identity)",
            tags=ctx.tags,
            opts=pulumi.ResourceOptions(parent=self),
        )
        for index, policy in enumerate(inline_policies):
            aws.iam.RolePolicy(
                ctx.name("storage", f"{driver}-csi-policy-{index}"),
                role=role.id,
                policy=policy,
                opts=pulumi.ResourceOptions(parent=role),
            )
        for policy_arn in managed:
            aws.iam.RolePolicyAttachment(
                ctx.name("storage", f"{driver}-csi-{policy_arn.rsplit('/', 1)[-1]}"),
                role=role.name,
                policy_arn=policy_arn,
                opts=pulumi.ResourceOptions(parent=role),
            )
        return role

    def _associate(self, driver: str, role: aws.iam.Role, service_accounts: Sequence[str]) -> list[pulumi.Resource]:
        return [
            aws.eks.PodIdentityAssociation(
                self._ctx.name("storage", f"{driver}-{account}"),
                cluster_name=self._args.cluster.name,
                namespace=ADDON_NAMESPACE,
                service_account=account,
                role_arn=role.arn,
                tags=self._ctx.tags,
                opts=pulumi.ResourceOptions(parent=self, depends_on=list(self._args.cluster.eks_dependencies)),
            )
            for account in service_accounts
        ]

    def _addon(
        self, addon_name: str, depends_on: Sequence[pulumi.Resource], agent: aws.eks.Addon | None = None
    ) -> aws.eks.Addon:
        # The driver's pods must find their role association (and the agent) when they first start.
        needs = [
            *self._args.cluster.eks_dependencies,
            *self._args.wait_for,
            *depends_on,
            *([agent] if agent else []),
        ]
        addon = aws.eks.Addon(
            self._ctx.name("storage", addon_name),
            cluster_name=self._args.cluster.name,
            addon_name=addon_name,
            addon_version={str(k): v for k, v in self._args.config.addon_versions.items()}.get(addon_name),
            resolve_conflicts_on_create="OVERWRITE",
            resolve_conflicts_on_update="PRESERVE",
            tags=self._ctx.tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=needs),
        )
        self.addons[addon_name] = addon
        return addon


def helm_release(
    ctx: StackContext,
    chart: HelmChart,
    values: dict,
    cluster: ClusterInfo,
    parent: pulumi.Resource,
    depends_on: Sequence[pulumi.Resource] = (),
) -> k8s.helm.v3.Release:
    return k8s.helm.v3.Release(
        ctx.name("storage", chart.chart),
        name=chart.chart,
        chart=chart.chart,
        version=chart.version,
        repository_opts={"repo": chart.repo},
        namespace=chart.namespace,
        create_namespace=chart.namespace != "kube-system",
        values=values,
        atomic=True,
        timeout=600,
        opts=pulumi.ResourceOptions(parent=parent, provider=cluster.provider, depends_on=list(depends_on)),
    )


@dataclass(frozen=True)
class OnpremStorageDriversArgs:
    config: StorageConfig
    cluster: ClusterInfo
    depends_on: Sequence[pulumi.Resource] = field(default_factory=tuple)


def ibm_cos_values(cos: CosConfig) -> dict[str, Any]:
    """ibm-object-storage-plugin 2.2.58 values for a plain Kubernetes cluster (not IBM Cloud, not OpenShift).

    The chart's defaults are IBM Cloud VPC (values.yaml:21-34: provider IBMC-VPC, platform OpenShift, workerOS
    redhat); its `helm ibmc` plugin sets the real ones from the cluster and refuses clusters that are not IBM's.
    Here they are set from config:
    - platform K8S: no security.openshift.io SecurityContextConstraints (templates/flex-driver-sa.yaml:21).
    - provider IPI (installer-provisioned, self-managed): with SATELLITE the only providers whose images come from
      the public registry icr.io/cpopen (templates/flex-driver.yaml:98-101, provisioner.yaml:70-73); any other
      pulls icr.io/ibm, which needs IBM's pull secret. IPI keeps the flex driver off Red Hat CoreOS nodes
      (flex-driver.yaml:48-57) and always renders two StorageClasses, ibmc-s3fs-cos and ibmc-s3fs-cos-perf
      (templates/ibmc-s3fs-cos.yaml:1): this stack owns them by giving them its COS endpoint and location
      constraint (cos.endpoint / cos.storageClass, rendered at ibmc-s3fs-cos.yaml:52-53) instead of the chart's
      "NA"; the class jobs use is still this stack's own (classes.py).
    - workerOS from config (Red Hat workers also get the chart's CoreOS DaemonSet, flex-driver-coreos.yaml:1).
      The driver is installed under /usr/libexec/kubernetes, the kubelet's default flex directory
      (flex-driver.yaml:171; 2.2.24's kubeDriver value is gone).
    The flex driver DaemonSet tolerates every taint (flex-driver.yaml:69-70).
    """
    return {
        "license": True,
        "provider": "IPI",
        "platform": "K8S",
        "workerOS": cos.worker_os,
        "cos": {"endpoint": cos.endpoint, "storageClass": cos.location_constraint},
    }


def csi_s3_values() -> dict[str, Any]:
    """csi-s3 0.43.7: no Secret and no StorageClass from the chart (classes.py owns them). Its node DaemonSet
    tolerates only CriticalAddonsOnly and not-ready/unreachable by default (templates/csi-s3.yaml:39-51,
    values.yaml:43-46), so it is missing from tainted GPU nodes, where the Jobs mount COS; `all` makes it
    tolerate every taint, like the other node-side CSI drivers (IBM flex, NFS, EFS, Mountpoint)."""
    return {"secret": {"create": False}, "storageClass": {"create": False}, "tolerations": {"all": True}}


def nfs_values() -> dict[str, Any]:
    """csi-driver-nfs 4.13.4: its node DaemonSet already tolerates every taint (values.yaml:138-139,
    node.tolerations: [{operator: Exists}]); set explicitly so a chart upgrade cannot narrow it."""
    return {"node": {"tolerations": [{"operator": "Exists"}]}}


class OnpremStorageDrivers(pulumi.ComponentResource):
    """Attributes: cos_driver (Release or None), nfs_driver (Release or None)."""

    def __init__(self, ctx: StackContext, args: OnpremStorageDriversArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ml-cluster:infra:OnpremStorageDrivers", ctx.name("storage", "drivers"), None, opts)
        config = args.config
        self.cos_driver: k8s.helm.v3.Release | None = None
        self.nfs_driver: k8s.helm.v3.Release | None = None
        if config.cos is not None:
            if config.cos.driver == "ibm-flex":
                self.cos_driver = helm_release(
                    ctx, IBM_COS_CHART, ibm_cos_values(config.cos), args.cluster, self, args.depends_on
                )
            else:
                values = csi_s3_values()
                self.cos_driver = helm_release(ctx, CSI_S3_CHART, values, args.cluster, self, args.depends_on)
        if config.nfs is not None:
            values = nfs_values()
            self.nfs_driver = helm_release(ctx, NFS_CHART, values, args.cluster, self, args.depends_on)
        self.register_outputs({})
