"""Storage config rules: each bad value is rejected with a message naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from infra.config import ConfigError, parse_stack_config
from infra.config.storage import StorageConfig
from tests.conftest import stack_values

COS = {"endpoint": "https://s3.us-south.cloud-object-storage.appdomain.cloud", "buckets": [{"name": "datasets"}]}


def problems(stack: str, storage: dict[str, Any], secret_keys: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    values = stack_values(stack)
    values["ml-cluster:storage"] = storage
    secrets = [key for key, value in values.items() if isinstance(value, dict) and set(value) == {"secure"}]
    decoded = {key: ("placeholder" if key in secrets else value) for key, value in values.items()}
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(decoded, [*secrets, *secret_keys])
    return caught.value.problems


def test_every_committed_stack_storage_section_is_valid() -> None:
    for stack in ("dev", "staging", "prod", "onprem"):
        StorageConfig.model_validate(stack_values(stack)["ml-cluster:storage"])


def test_cos_without_endpoint_names_the_field() -> None:
    found = problems("onprem", {"cos": {"buckets": [{"name": "datasets"}]}})
    assert ("storage.cos.endpoint", "required key is missing") in found


def test_cos_endpoint_must_be_https() -> None:
    found = problems("onprem", {"cos": {**COS, "endpoint": "http://cos.example.com"}})
    assert [path for path, _ in found] == ["storage.cos.endpoint"]
    assert "https://" in found[0][1]


def test_cos_without_hmac_keys_is_rejected() -> None:
    storage = StorageConfig.model_validate({"cos": COS})
    with pytest.raises(ValueError, match="cosHmacAccessKeyId and ml-cluster:cosHmacSecretAccessKey"):
        storage.check_stack("onprem", has_cos_keys=False)
    storage.check_stack("onprem", has_cos_keys=True)


def test_unknown_storage_class_reference_lists_known_classes() -> None:
    found = problems("dev", {"efs": {}, "sharedVolumes": [{"name": "ckpt", "storageClass": "efs-typo"}]})
    assert len(found) == 1
    assert "storage.sharedVolumes[0].storageClass: 'efs-typo'" in found[0][1]
    assert "efs-ap" in found[0][1]


def test_shared_volume_cannot_use_block_class() -> None:
    found = problems("dev", {"gp3": {}, "sharedVolumes": [{"name": "ckpt", "storageClass": "gp3"}]})
    assert "not a ReadWriteMany class" in found[0][1]


@pytest.mark.parametrize("storage, path, fragment", [
    ({"efs": {"storageClass": {"basePath": "/"}}}, "storage.efs.storageClass.basePath", "below '/'"),
    ({"efs": {"storageClass": {"directoryPerms": "799"}}}, "storage.efs.storageClass.directoryPerms", "pattern"),
    ({"efs": {"throughputMode": "provisioned"}}, "storage.efs", "provisionedThroughputMibps"),
    ({"efs": {"performanceMode": "maxIO"}}, "storage.efs", "elastic does not support"),
    ({"efs": {"transitionToIa": "AFTER_2_DAYS"}}, "storage.efs.transitionToIa", "AFTER_1_DAY"),
    ({"buckets": [{"name": "data", "kmsKeyArn": "arn:aws:kms:us-west-2:111122223333:key/abc"}]},
     "storage.buckets.0", "needs encryption: aws:kms"),
    ({"buckets": [{"name": "data", "noncurrentVersionExpiryDays": 7}]}, "storage.buckets.0", "versioning"),
    ({"buckets": [{"name": "data", "scratchPrefixes": ["/tmp"]}]}, "storage.buckets.0.scratchPrefixes.0", "'/'"),
    ({"buckets": [{"name": "data", "bucketName": "Bad_Name"}]}, "storage.buckets.0.bucketName", "bucket name"),
    ({"buckets": [{"name": "data"}, {"name": "data"}]}, "storage", "unique"),
    ({"buckets": [{"name": "data", "encrypton": "AES256"}]}, "storage.buckets.0.encrypton", "unknown key"),
])
def test_field_errors(storage: dict[str, Any], path: str, fragment: str) -> None:
    found = problems("dev", storage)
    matching = [why for where, why in found if where == path]
    assert matching, found
    assert fragment in matching[0]


def test_aws_storage_on_onprem_is_rejected() -> None:
    storage = StorageConfig.model_validate({"efs": {}, "buckets": [{"name": "data"}]})
    with pytest.raises(ValueError, match=r"storage\.efs, storage\.buckets: needs platform eks"):
        storage.check_stack("onprem", has_cos_keys=False)


def test_mounted_cos_bucket_needs_onprem_driver() -> None:
    storage = StorageConfig.model_validate({"cos": {**COS, "buckets": [{"name": "datasets", "mount": True}]}})
    with pytest.raises(ValueError, match="mount: true needs the onprem COS driver"):
        storage.check_stack("eks", has_cos_keys=True)
