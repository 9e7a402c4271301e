"""StackConfig: every key of a stack file, validated in one pass before any resource is registered."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator, model_validator

from infra.config.base import JOBS_NAMESPACE, NAMESPACE, StrictModel, listed_twice
from infra.config.cluster import (
    ClusterConfig,
    NetworkConfig,
    OnpremConfig,
)
from infra.config.controllers import JobControllersConfig
from infra.config.deploy import DeployConfig, reachability_problems
from infra.config.egress import JobEgressConfig
from infra.config.errors import ConfigError
from infra.config.monitoring import MonitoringConfig
from infra.config.nodepools import GpuConfig, NodePoolConfig
from infra.config.nodes import NodesConfig, move_renamed_keys, written_path
from infra.config.queueing import KueueConfig
from infra.config.registry import RegistryConfig
from infra.config.storage import StorageConfig
from infra.stackyaml import StackFileError, read_stack_document
from workloads.jobspec import TrainingJobSpec
from workloads.k8snames import is_dns_subdomain, reserved_namespace

# Config keys (without the namespace) whose values must be Pulumi secrets.
SECRET_KEYS = ("kubeconfig", "cosHmacAccessKeyId", "cosHmacSecretAccessKey")


# Tag keys the EBS CSI driver refuses in a StorageClass's tagSpecification parameters
# (kubernetes-sigs/aws-ebs-csi-driver v1.64.0 pkg/driver/validation.go:45-56).
EBS_RESERVED_TAG_KEYS = ("CSIVolumeName", "CSIVolumeSnapshotName", "ebs.csi.aws.com/cluster-name")
EBS_RESERVED_TAG_PREFIXES = ("kubernetes.io", "ebs.csi.aws.com/")


class StackConfig(StrictModel):
    pulumi_text_scalars: ClassVar[bool] = True

    platform: Literal["eks", "onprem"]
    ("eks: the program creates the VPC (or adopts one), the EKS cluster and its node groups; onprem: an existing "
     "cluster reached with ml-cluster:kubeconfig")
    region: str | None = None
    """from aws:region"""
    protected: bool = False
    """prod: stateful resources protected and retained"""
    # A deploying run refuses credentials for any other account (infra.config.placeholders.account_problems).
    account_id: str | None = None
    """the AWS account; optional pin"""
    label_prefix: str = "ml-cluster.io"
    ("prefix of the node labels and Kubernetes labels the stack sets (<prefix>/gpu-type, <prefix>/disktype, "
     "<prefix>/stack, ...)")
    tags: dict[str, str] = {}
    """AWS tags on every taggable resource and on the gp3 class's volumes, beside project, stack and managed-by"""
    network: NetworkConfig | None = None
    """the VPC (EKS only)"""
    cluster: ClusterConfig | None = None
    """the EKS cluster (EKS only)"""
    onprem: OnpremConfig | None = None
    """the existing cluster (onprem only)"""
    node_pools: list[NodePoolConfig] = []
    """GPU and CPU node pools: EKS managed node groups, or on onprem the existing nodes' shape"""
    gpu: GpuConfig = Field(default_factory=GpuConfig)
    """NVIDIA device plugin, DCGM exporter, EFA device plugin, GPU burn-in and the node monitoring agent"""
    nodes: NodesConfig = Field(default_factory=NodesConfig)
    ("what applies to every node pool: how the pools scale (cluster-autoscaler) and what each node holds back from "
     "pods")
    kueue: KueueConfig = Field(default_factory=KueueConfig)
    """Kueue: gang admission, GPU quota, priorities and teams"""
    job_controllers: JobControllersConfig = Field(default_factory=JobControllersConfig)
    """JobSet and Kubeflow Trainer v2: the gang controllers beside the batch/v1 Indexed Job"""
    storage: StorageConfig = Field(default_factory=StorageConfig)
    """EFS, gp3, S3 and COS buckets, NFS, shared volumes and the storage add-ons"""
    registry: RegistryConfig = Field(default_factory=RegistryConfig)
    """the stack's ECR repository for training images (EKS only)"""
    job_egress: JobEgressConfig = Field(default_factory=JobEgressConfig)
    """where training pods may open connections (a NetworkPolicy)"""
    deploy: DeployConfig = Field(default_factory=DeployConfig)
    """where the deploy and preview workflow jobs run, and whether that runner can reach the cluster's API endpoint"""
    monitoring: MonitoringConfig = Field(default_factory=MonitoringConfig)
    """kube-prometheus-stack, the GPU alert rules and the training dashboard"""
    jobs: list[TrainingJobSpec] = []
    """training Jobs deployed with the stack, each created held until `submit start` releases it."""
    kubeconfig: SecretStr | None = None
    """onprem: the kubeconfig of the existing cluster, a Pulumi secret"""
    cos_hmac_access_key_id: SecretStr | None = None
    """with storage.cos: the COS HMAC access key id, a Pulumi secret"""
    cos_hmac_secret_access_key: SecretStr | None = None
    """with storage.cos: the COS HMAC secret access key, a Pulumi secret"""

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, values: Any) -> Any:
        """Old spellings (gpu.autoscaler, gpu.sizing) are read as their new keys (nodes.autoscaler, nodes.sizing)."""
        return move_renamed_keys(values) if isinstance(values, Mapping) else values

    @field_validator("account_id", mode="before")
    @classmethod
    def _account_id(cls, value: object) -> object:
        if isinstance(value, int) and not isinstance(value, bool):  # unquoted in YAML; Pulumi passes text
            value = f"{value:012d}"
        if not isinstance(value, str):
            return value
        if not re.fullmatch(r"\d{12}", value):
            raise ValueError(f"{value!r} is not a 12-digit AWS account id (quote it in YAML: \"012345678901\")")
        return value

    @field_validator("label_prefix")
    @classmethod
    def _label_prefix(cls, value: str) -> str:
        if not is_dns_subdomain(value):
            raise ValueError(f"{value!r} is not a DNS subdomain (e.g. ml-cluster.io)")
        return value

    @field_validator("tags")
    @classmethod
    def _tags(cls, tags: dict[str, str]) -> dict[str, str]:
        for key, value in tags.items():
            if key.lower().startswith("aws:"):
                raise ValueError(f"tag key {key!r}: the aws: prefix is reserved by AWS")
            # The gp3 class hands the tags to the EBS CSI driver as `key=value` templates (infra/storage/classes.py
            # ebs_tag_parameters); it refuses these keys, splits at the first '=' and evaluates '{{'.
            if key in EBS_RESERVED_TAG_KEYS or key.startswith(EBS_RESERVED_TAG_PREFIXES):
                raise ValueError(f"tag key {key!r}: reserved by the EBS CSI driver, which tags the gp3 class's "
                                 f"volumes with the stack's tags ({', '.join(EBS_RESERVED_TAG_PREFIXES)}..., "
                                 f"{', '.join(EBS_RESERVED_TAG_KEYS)})")
            if "=" in key or "{{" in value:
                raise ValueError(f"tag {key!r}: no '=' in a key and no '{{{{' in a value (the EBS CSI driver "
                                 "reads the gp3 class's tags as key=value templates)")
        return tags

    def _check_health_gate(self) -> None:
        """A gate nothing opens: with the burn-in off by default (an unprotected stack) and `gate: true`, every GPU
        Job would wait for a gpu-health=passed label no node ever gets."""
        health = self.gpu.health
        if health.gate is True and not health.runs(self.protected):
            raise ValueError("gpu.health.gate: true, but the burn-in does not run in this stack (gpu.health.enabled "
                             "is unset and the stack is not protected): nothing would label a node gpu-health=passed "
                             "and every GPU Job would stay Pending; set gpu.health.enabled: true or drop the gate")

    def _check_team_namespaces(self) -> None:
        """A tenant team's namespace is its own: never Kubernetes' or one the stack installs into."""
        own = frozenset({JOBS_NAMESPACE, self.kueue.namespace, self.monitoring.namespace, self.gpu.health.namespace,
                         self.job_controllers.jobset.namespace, self.job_controllers.trainer.namespace})
        for index, team in enumerate(self.kueue.teams):
            why = reserved_namespace(team.namespace, own) if team.namespace else None
            if why:
                raise ValueError(f"kueue.teams[{index}].namespace: {why}; give team {team.name} a namespace of "
                                 "its own")

    def _check_external(self) -> None:
        """An adopted release (`external`) is someone else's only on a cluster the stack does not create."""
        adopted = [key for key, section in (("kueue", self.kueue), ("monitoring", self.monitoring),
                                             ("gpu.devicePlugin", self.gpu.device_plugin),
                                             ("gpu.dcgmExporter", self.gpu.dcgm_exporter),
                                             ("gpu.efaDevicePlugin", self.gpu.efa_device_plugin),
                                             ("nodes.autoscaler", self.nodes.autoscaler))
                   if section.external is not None]
        adopted = [f"{key}.external" for key in adopted]
        if self.storage.external_addons:
            adopted.append("storage.externalAddons")
        if adopted and self.platform == "eks" and not (self.cluster is not None and self.cluster.existing):
            raise ValueError(f"{adopted[0]}: only a cluster the stack does not create runs releases or add-ons of "
                             "its own (set cluster.existing: true, or drop it)")

    @model_validator(mode="after")
    def _platform(self) -> StackConfig:
        if self.platform == "eks":
            missing = [key for key, value in (("aws:region", self.region), ("ml-cluster:network", self.network),
                                               ("ml-cluster:cluster", self.cluster)) if value is None]
            if missing:
                raise ValueError(f"platform eks needs {', '.join(missing)}")
            if self.onprem is not None or self.kubeconfig is not None:
                raise ValueError("platform eks: onprem and kubeconfig belong to platform onprem")
            if self.cluster is not None and self.cluster.existing and self.network is not None \
                    and self.network.existing is None:
                raise ValueError("cluster.existing: the cluster's VPC is not the stack's to create: set "
                                 "network.existing (its vpcId and the subnets for the stack's pools)")
        else:
            if self.onprem is None or self.kubeconfig is None:
                raise ValueError("platform onprem needs ml-cluster:onprem and the secret ml-cluster:kubeconfig")
            if self.network is not None or self.cluster is not None:
                raise ValueError("platform onprem creates no AWS network or cluster: remove network and cluster")
        self.storage.check_stack(self.platform, has_cos_keys=self.cos_hmac_access_key_id is not None
                                 and self.cos_hmac_secret_access_key is not None)
        self._check_team_namespaces()
        self._check_health_gate()
        self._check_external()
        names = [pool.name for pool in self.node_pools]
        duplicates = listed_twice(names)
        if duplicates:
            raise ValueError(f"node pool names must be unique: {', '.join(duplicates)}")
        missing = [name for name in self.job_controllers.integrations() if name not in self.kueue.integrations]
        if self.kueue.enabled and missing:
            # Kueue leaves a kind it does not integrate alone: a queued JobSet or TrainJob would run unadmitted.
            raise ValueError(f"kueue.integrations must list {', '.join(missing)} (jobControllers enables it): "
                             "without it Kueue ignores the queue label and the gang runs outside the quota")
        job_names = [job.name for job in self.jobs]
        duplicate_jobs = listed_twice(job_names)
        if duplicate_jobs:
            raise ValueError(f"job names must be unique: {', '.join(duplicate_jobs)}")
        return self

    @property
    def kubernetes_version(self) -> str:
        if self.cluster is not None:
            return self.cluster.kubernetes_version
        assert self.onprem is not None
        return self.onprem.kubernetes_version

    @property
    def cluster_name(self) -> str:
        if self.cluster is not None:
            return self.cluster.name
        assert self.onprem is not None
        return self.onprem.cluster_name


def _location(loc: tuple[int | str, ...]) -> str:
    """A dotted path; odd keys (spaces, newlines, empty) are quoted so the error stays one readable line."""
    parts = [str(part) if re.fullmatch(r"[A-Za-z0-9_:/-]+", str(part)) else json.dumps(str(part)) for part in loc]
    return ".".join(parts) or "config"


def _model_at(loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The config model a location's last key is written in (StackConfig for a top-level key), or None."""
    model: Any = StackConfig
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        fields = {field.alias or name: field for name, field in model.model_fields.items()}
        field = fields.get(str(part)) or model.model_fields.get(str(part))
        if field is None:
            return None
        model = next((t for t in _flatten(field.annotation) if isinstance(t, type) and issubclass(t, BaseModel)),
                     None)
        if model is None:
            return None
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _flatten(annotation: Any) -> list[Any]:
    """The types inside Optional / list / dict / Annotated."""
    args = get_args(annotation)
    return [annotation] if not args else [inner for arg in args for inner in _flatten(arg)]


def _unknown_key(loc: tuple[int | str, ...]) -> str:
    model = _model_at(loc)
    known = sorted(field.alias or name for name, field in model.model_fields.items()) if model else []
    close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6) if loc else []
    hint = (f"did you mean {close[0]!r}?" if close
            else "check the spelling; docs/reference/stack-config.md lists the keys")
    return f"unknown key ({hint})"


def _message(error: Mapping[str, Any]) -> str:
    kind, text = error["type"], str(error["msg"])
    if kind == "extra_forbidden":
        return _unknown_key(tuple(error["loc"]))
    if kind == "missing":
        return "required key is missing"
    return text.removeprefix("Value error, ").removeprefix("Assertion failed, ").replace("\n", " ")


def _problem(error: Mapping[str, Any]) -> tuple[str, str]:
    """(path, why) for one pydantic error; a nested error that knows its own field path extends the location."""
    cause = (error.get("ctx") or {}).get("error")
    sub_path, reason = getattr(cause, "path", None), getattr(cause, "reason", None)
    if isinstance(sub_path, str) and sub_path and isinstance(reason, str):
        return f"{_location(error['loc'])}.{sub_path}", reason.replace("\n", " ")
    return _location(error["loc"]), _message(error)


PLAINTEXT = "plaintext-rejected"  # stands for a secret given in plaintext: present, but never the value


def config_values(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The values of this project's keys by their names in the schema (`ml-cluster:x` -> `x`, `aws:region` ->
    `region`); other namespaces are left to their providers."""
    ours: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "aws:region":
            ours["region"] = value
        elif key.startswith(NAMESPACE):
            ours[key[len(NAMESPACE):]] = value
    return ours


def parse_stack_config(raw: Mapping[str, Any], secret_keys: Iterable[str] = ()) -> StackConfig:
    """Validate a stack's config (keys as in the stack file: `ml-cluster:x`, `aws:region`, ...).

    `raw` values are already-parsed YAML/JSON values. Keys listed in `secret_keys` are Pulumi secrets; a value for
    one of SECRET_KEYS that is not a secret is rejected, so no credential can sit in a stack file in plaintext.
    Raises ConfigError listing every problem found.
    """
    secret = set(secret_keys)
    problems: list[tuple[str, str]] = []
    ours = config_values(raw)
    for key in raw:
        if key.startswith(NAMESPACE) and key[len(NAMESPACE):] in SECRET_KEYS and key not in secret:
            problems.append((key, "must be a secret: pulumi config set --secret " + key))
            ours[key[len(NAMESPACE):]] = PLAINTEXT  # present, so no rule that needs the key reports it missing too
        elif ":" not in key:
            problems.append(("config", f"key {key!r} needs a namespace, e.g. {NAMESPACE}{key}"))
    try:
        config = StackConfig.model_validate(ours)
    except ValidationError as exc:
        problems.extend(written_path(path, ours, why) for path, why in map(_problem, exc.errors()))
        raise ConfigError(problems) from None
    problems += unused_secret_problems(config, [key for key in raw if key in secret])
    if config.cluster is not None:  # the deploy workflow's runner must reach the API server
        problems += reachability_problems(config.cluster, config.deploy)
    problems += zone_region_problems(config)
    problems += gpu_health_problems(config)
    problems += capacity_label_problems(config)
    if problems:
        raise ConfigError(problems)
    return config


def capacity_label_problems(config: StackConfig) -> list[tuple[str, str]]:
    """`<prefix>/capacity` (reserved / unreserved) keeps Kueue's reserved and unreserved flavors of a GPU type on
    disjoint nodes (infra/nodes/poolplan.py); a pool that set it itself would put on-demand Jobs on a reservation or
    the reverse."""
    key = f"{config.label_prefix}/capacity"
    return [(f"nodePools.{index}.labels", f"{key} is set by the stack (reserved capacity), never by a pool")
            for index, pool in enumerate(config.node_pools) if key in pool.labels]


def zone_region_problems(config: StackConfig) -> list[tuple[str, str]]:
    """Availability zones of another region than aws:region (us-east-1a in eu-west-1) cannot hold its subnets."""
    if config.region is None or config.network is None or config.network.create is None:
        return []
    return [(f"network.create.availabilityZones.{index}", f"{zone} is not a zone of aws:region {config.region}")
            for index, zone in enumerate(config.network.create.availability_zones)
            if not re.fullmatch(re.escape(config.region) + r"[a-z]", zone)]


def gpu_health_problems(config: StackConfig) -> list[tuple[str, str]]:
    """The burn-in runs the training image; nothing but the burn-in may set its label (a pool label
    `<prefix>/gpu-health` would let every new node through the gate unchecked)."""
    problems = []
    health = config.gpu.health
    health_label = f"{config.label_prefix}/gpu-health"
    for index, pool in enumerate(config.node_pools):
        if health_label in pool.labels:
            problems.append((f"nodePools.{index}.labels", f"{health_label} is set by the GPU burn-in only "
                                                          "(gpu.health), never by a pool"))
    if not health.runs(config.protected) or not any(pool.gpu for pool in config.node_pools):
        return problems
    if health.image is None and health.image_tag is None:
        problems.append(("gpu.health.image", "required: the burn-in runs the training image (image, or imageTag "
                                             "of the stack's registry); or set gpu.health.enabled: false"))
    elif health.image_tag is not None and not (config.platform == "eks" and config.registry.enabled):
        problems.append(("gpu.health.imageTag", "this stack has no image registry: give a full image reference"))
    return problems


def unused_secret_problems(config: StackConfig, secret_keys: Iterable[str]) -> list[tuple[str, str]]:
    """A secret nothing in the stack reads (the COS keys without COS storage): refused, not ignored."""
    cos_keys = (f"{NAMESPACE}cosHmacAccessKeyId", f"{NAMESPACE}cosHmacSecretAccessKey")
    problems = []
    for key in secret_keys:
        if key in cos_keys and config.storage.cos is None:
            problems.append((key, f"stack has no {NAMESPACE}storage.cos, so nothing uses this secret: "
                                  f"pulumi config rm {key}"))
    return problems


def decode_config_value(value: Any) -> Any:
    """A config value as Pulumi hands it to the program: objects and lists arrive as JSON text."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def read_stack_file(path: Path) -> tuple[dict[str, Any], list[str]]:
    """Read `config:` from a Pulumi.<stack>.yaml: (values, keys holding `secure:` ciphertext).

    Secure values are returned as their ciphertext; they can only be decrypted by the Pulumi CLI.
    Raises ConfigError (with the file as the path) for unreadable or malformed files.
    """
    where = str(path)
    try:
        document = read_stack_document(path)
    except StackFileError as exc:
        raise ConfigError([(where, exc.why)]) from None
    if document is None:
        document = {}
    if not isinstance(document, dict):
        raise ConfigError([(where, "a stack file must be a mapping with a `config:` key")])
    unknown = sorted(set(document) - {"config", "secretsprovider", "encryptedkey", "encryptionsalt", "environment"})
    if unknown:
        raise ConfigError([(where, f"unknown top-level key(s): {', '.join(map(str, unknown))}")])
    values = document.get("config") or {}
    if not isinstance(values, dict):
        raise ConfigError([(f"{where}: config", "must be a mapping of config keys")])
    secure = [key for key, value in values.items() if isinstance(value, dict) and set(value) == {"secure"}]
    return {str(key): value for key, value in values.items()}, secure


def load_pulumi_config() -> StackConfig:
    """The running program's stack config (as the Pulumi CLI, or the offline engine, hands it over)."""

    return parse_stack_config(runtime_config_values(), runtime_secret_keys())


def runtime_secret_keys() -> set[str]:
    """The config keys the Pulumi CLI (or the offline engine) marks as secrets."""
    from pulumi.runtime import config as runtime_config

    return set(runtime_config.get_config_secret_keys_env()) | set(runtime_config._SECRET_KEYS.get())


def runtime_config_values() -> dict[str, Any]:
    """The running program's config values (decoded), as the Pulumi CLI or the offline engine hands them over."""
    from pulumi.runtime import config as runtime_config

    raw = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    return {key: decode_config_value(value) for key, value in raw.items()}
