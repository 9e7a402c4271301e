"""scripts/versions.py: pinned charts against their repositories' newest releases, and the stacks' Kubernetes
minors against the calendar, with a fixed day and index documents served from memory."""

from __future__ import annotations

import re
from datetime import date
from typing import Any

import pytest

from scripts import versions
from scripts.versions import newest_release, pinned_charts, report

INDEX = {"entries": {
    "cluster-autoscaler": [{"version": "9.59.0"}, {"version": "9.60.1"}, {"version": "9.61.0-rc.1"},
                           {"version": "9.9.9"}],
    "nvidia-device-plugin": [{"version": "0.20.0"}, {"version": "0.19.3"}],
}}


def test_newest_release_orders_numerically_and_skips_pre_releases() -> None:
    assert newest_release(INDEX, "cluster-autoscaler") == "9.60.1"
    assert newest_release(INDEX, "absent") is None
    assert newest_release({"entries": {"x": [{"version": None}, "junk"]}}, "x") is None


def test_report_flags_what_is_behind(stack_plan: Any) -> None:
    plans = [stack_plan("dev"), stack_plan("onprem")]
    asked: list[str] = []

    def index_of(repo: str) -> dict[str, Any]:
        asked.append(repo)
        if "autoscaler" in repo or "k8s-device-plugin" in repo:
            return INDEX
        raise OSError("connection refused")

    lines, behind = report(plans, date(2027, 1, 1), online=True, index_of=index_of)
    text = "\n".join(lines)
    assert "chart cluster-autoscaler 9.59.0 is behind 9.60.1" in behind
    assert not any("nvidia-device-plugin" in item for item in behind)
    assert "not checked (OCI registry" in text and "unreadable (connection refused)" in text
    assert not any(repo.startswith("oci://") for repo in asked)
    # 1.35 leaves EKS standard support on 2027-03-27: within 90 days of 2027-01-01
    assert "stack dev: Kubernetes 1.35 leaves support on 2027-03-27" in behind
    assert not any(item.startswith("stack onprem") for item in behind)
    assert {c.name for c in pinned_charts(plans)} >= {"cluster-autoscaler", "kueue", "ibm-object-storage-plugin"}


def test_offline_cli_reports_without_failing(capsys: pytest.CaptureFixture[str]) -> None:
    assert versions.main(["--stacks", "dev", "--today", "2026-11-24", "--fail-behind"]) == 0
    out = capsys.readouterr().out
    assert "not checked (offline)" in out and "dev        1.35   standard   2027-03-27 (123 days; EKS)" in out
    assert versions.main(["--stacks", "dev", "--today", "2027-03-01", "--fail-behind"]) == 1
    assert "behind:" in capsys.readouterr().out
    assert versions.main(["--stacks", "nope"]) == 2


DOCKERFILE = """# syntax=docker/dockerfile:1
FROM --platform=linux/amd64 pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime@sha256:{digest}
RUN curl -o /tmp/x https://efa-installer.amazonaws.com/aws-efa-installer-1.47.0.tar.gz
"""
PYPROJECT = """[project]
name = "x"
dependencies = ["pulumi>=3.200,<4", "pulumi-aws>=7.0,<8"]
[project.optional-dependencies]
train = ["torch==2.13.0"]
"""


def test_base_image_is_read_from_the_first_from_line() -> None:
    image = versions.base_image(DOCKERFILE.format(digest="a" * 64))
    assert (image.repository, image.tag, image.digest) == ("pytorch/pytorch", "2.13.0-cuda13.0-cudnn9-runtime",
                                                          "sha256:" + "a" * 64)
    assert (image.cuda, image.cudnn) == ("13.0", "9")
    assert versions.base_image("FROM registry:5000/team/img\n") == versions.BaseImage("registry:5000/team/img", None,
                                                                                      None)
    for text in ("ARG BASE=x\nFROM ${BASE}\n", "RUN true\n"):
        with pytest.raises(ValueError):
            versions.base_image(text)


def test_toolchain_report_names_image_driver_pulumi_and_amis(stack_plan: Any) -> None:
    pinned = "sha256:" + "a" * 64
    moved = "sha256:" + "b" * 64
    asked: list[tuple[str, str]] = []

    def digest_of(repository: str, tag: str) -> str:
        asked.append((repository, tag))
        return moved

    def newest_of(package: str) -> str:
        newest = {"pulumi": "3.300.0", "pulumi-aws": "8.1.0"}
        if package not in newest:
            raise OSError("connection refused")
        return newest[package]

    lines, behind = versions.toolchain_report(
        [stack_plan("dev"), stack_plan("staging")], True, DOCKERFILE.format(digest="a" * 64), PYPROJECT,
        digest_of=digest_of, newest_of=newest_of,
        installed_of={"pulumi": "3.272.0", "pulumi-aws": "6.9.0"}.get, plugin_of=lambda package: None)
    text = "\n".join(lines)
    assert asked == [("pytorch/pytorch", "2.13.0-cuda13.0-cudnn9-runtime")]
    assert f"the tag now: {moved}" in text and "driver >= 580.65.06" in text
    assert "torch          ==2.13.0" in text and "EFA installer  1.47.0" in text
    assert f"base image pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime now points at {moved}, not the pinned " \
           f"{pinned}" in behind
    assert "pulumi-aws 6.9.0 is installed, outside pyproject's <8,>=7.0" in behind
    assert "pulumi-aws 8.1.0 is out, outside pyproject's <8,>=7.0" in behind
    assert not any(item.startswith("pulumi ") for item in behind)  # 3.300.0 is inside <4,>=3.200
    assert "unreadable (connection refused)" in text  # pulumi-kubernetes
    assert re.search(r"dev +gpu-a10g +AL2023_x86_64_NVIDIA +not pinned: EKS's latest for 1\.35", text)
    assert re.search(r"staging +gpu-a10g +BOTTLEROCKET_x86_64_NVIDIA ", text)


def test_an_unpinned_base_is_reported_and_never_behind() -> None:
    lines, behind = versions.toolchain_report([], True, "FROM pytorch/pytorch:2.13.0-cuda12.8-cudnn9-runtime\n",
                                              PYPROJECT, digest_of=lambda repository, tag: "sha256:" + "c" * 64,
                                              newest_of=lambda package: "3.201.0", installed_of=lambda package: None,
                                              plugin_of=lambda package: None)
    text = "\n".join(lines)
    assert "digest: not pinned (tag only)" in text and "driver >= 570.26" in text
    assert not any("base image" in item for item in behind)


def test_docs_versions_names_the_base_image_and_the_pulumi_ranges_pinned_today() -> None:
    import tomllib

    docs = (versions.ROOT / "docs" / "versions.md").read_text()
    image = versions.base_image(versions.DOCKERFILE.read_text())
    assert f"`{image.repository}:{image.tag}`" in docs
    assert f">= {versions.CUDA_MIN_DRIVER[image.cuda or '']}" in docs
    dependencies = tomllib.loads(versions.PYPROJECT.read_text())["project"]["dependencies"]
    for package in versions.PULUMI_PACKAGES:
        [text] = [d for d in dependencies if re.match(rf"{re.escape(package)}\s*[<>=!~]", d)]
        assert f"| {package}" in docs and f"`{text[len(package):].strip()}`" in docs, package


def test_an_autoscaler_tag_the_registry_does_not_publish_is_behind(stack_plan: Any) -> None:
    """A git tag of kubernetes/autoscaler is not an image: the pinned tag is checked against registry.k8s.io's
    tags/list (served from memory here), offline it is said to be unchecked."""
    plans = [stack_plan("dev"), stack_plan("prod")]
    pinned = versions.autoscaler_tags(plans)
    assert set(pinned) == {"v1.35.2"} and pinned["v1.35.2"] == ["dev", "prod"]
    asked: list[str] = []

    def published_without_it(repository: str) -> list[str]:
        asked.append(repository)
        return ["v1.34.5", "v1.35.0", "v1.35.1", "v1.36.1"]

    lines, behind = versions.autoscaler_report(plans, True, tags_of=published_without_it)
    assert asked == ["registry.k8s.io/autoscaling/cluster-autoscaler"]
    assert behind == ["cluster-autoscaler v1.35.2 (dev, prod) is not a tag of "
                      "registry.k8s.io/autoscaling/cluster-autoscaler"]
    assert re.search(r"v1\.35\.2 +dev, prod +NOT published", "\n".join(lines))
    lines, behind = versions.autoscaler_report(plans, True, tags_of=lambda repository: ["v1.35.2"])
    assert behind == [] and re.search(r"v1\.35\.2 +dev, prod +published", "\n".join(lines))
    offline, behind = versions.autoscaler_report(plans, False, tags_of=published_without_it)
    assert behind == [] and "not checked (offline)" in "\n".join(offline) and len(asked) == 1
