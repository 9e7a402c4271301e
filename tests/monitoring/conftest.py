"""The dataset tools' moto S3 server and packed dataset, for the end-to-end monitoring test."""

from tests.data.conftest import aws_env, bucket, moto_port, packed, s3_url  # noqa: F401 (fixtures)
