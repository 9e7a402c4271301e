"""A secret the stack does not use is refused: it would sit encrypted in the stack file, unused and unrotated, and
suggests a config that is not the one deployed."""

from __future__ import annotations

import pytest

from infra.config import ConfigError, parse_stack_config
from tests.conftest import stack_values


def test_cos_keys_on_a_stack_without_cos_are_refused_naming_each_key() -> None:
    values = {**stack_values("dev"), "ml-cluster:cosHmacSecretAccessKey": "x", "ml-cluster:cosHmacAccessKeyId": "y"}
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(values, ["ml-cluster:cosHmacSecretAccessKey", "ml-cluster:cosHmacAccessKeyId"])
    assert caught.value.lines() == [
        "error: ml-cluster:cosHmacSecretAccessKey: stack has no ml-cluster:storage.cos, so nothing uses this "
        "secret: pulumi config rm ml-cluster:cosHmacSecretAccessKey",
        "error: ml-cluster:cosHmacAccessKeyId: stack has no ml-cluster:storage.cos, so nothing uses this "
        "secret: pulumi config rm ml-cluster:cosHmacAccessKeyId"]


def test_the_stacks_that_use_their_secrets_still_parse() -> None:
    onprem = stack_values("onprem")
    secrets = [key for key, value in onprem.items() if isinstance(value, dict) and set(value) == {"secure"}]
    parse_stack_config({**onprem, **dict.fromkeys(secrets, "decrypted")}, secrets)
