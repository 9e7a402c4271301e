"""Which kubeconfig a tool talks to: the one `make kubeconfig STACK=<stack>` wrote for the stack, unless told
otherwise. A pure function of the arguments, the environment and the home directory, so every tool
(workloads.submit, scripts/verify_stack.py) resolves it the same way and says the same thing when there is none.

Order: `--kubeconfig FILE`, then `--stack S` (~/.kube/ml-S), then $KUBECONFIG, then ~/.kube/config. Inside a pod
(KUBERNETES_SERVICE_HOST set) with none of these, the pod's service account is used.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from workloads.k8snames import is_dns_label


class KubeconfigError(ValueError):
    """No usable kubeconfig: `where` names what was looked at, `why` what to do."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(f"{where}: {why}")
        self.where, self.why = where, why


@dataclass(frozen=True)
class KubeconfigChoice:
    files: tuple[str, ...]  # kubeconfig files, merged in order as kubectl does for KUBECONFIG; empty: in cluster
    source: str  # where the choice came from, for messages: "--kubeconfig", "--stack dev", "KUBECONFIG", ...

    @property
    def in_cluster(self) -> bool:
        return not self.files


def check_stack_name(stack: str) -> str:
    """`stack`, or KubeconfigError when it is no stack name (`../x`, `/etc/passwd`, empty)."""
    # A DNS label (infra.config.names.check_stack_name): it never carries a path into ~/.kube.
    if not is_dns_label(stack):
        raise KubeconfigError("--stack", f"{stack!r} is not a valid stack name: use lower-case letters, digits "
                                         "and '-', starting and ending with a letter or digit")
    return stack


def stack_kubeconfig_path(stack: str, home: Path) -> Path:
    """Where `make kubeconfig STACK=<stack>` writes the stack's kubeconfig."""
    return home / ".kube" / f"ml-{check_stack_name(stack)}"


def resolve_kubeconfig(explicit: str | None, stack: str | None, env: Mapping[str, str],
                       home: Path) -> KubeconfigChoice:
    """The kubeconfig to use, or KubeconfigError with one line saying how to get one."""
    hint = f"run make kubeconfig STACK={stack or '<stack>'}"
    if explicit:
        if Path(explicit).is_dir():
            raise KubeconfigError(explicit, "is a directory, not a kubeconfig file")
        if not Path(explicit).is_file():
            raise KubeconfigError(explicit, "no such kubeconfig file")
        return KubeconfigChoice((explicit,), "--kubeconfig")
    if stack is not None:
        path = stack_kubeconfig_path(stack, home)
        if not path.is_file():
            raise KubeconfigError(str(path), f"no kubeconfig for stack {stack}: {hint} (after make up)")
        return KubeconfigChoice((str(path),), f"--stack {stack}")
    listed = [item for item in env.get("KUBECONFIG", "").split(os.pathsep) if item]
    if listed:
        present = tuple(item for item in listed if Path(item).is_file())
        if not present:
            raise KubeconfigError("KUBECONFIG", f"{env['KUBECONFIG']}: no such file; {hint} or pass --stack")
        return KubeconfigChoice(present, "KUBECONFIG")
    default = home / ".kube" / "config"
    if default.is_file():
        return KubeconfigChoice((str(default),), "~/.kube/config")
    if env.get("KUBERNETES_SERVICE_HOST"):
        return KubeconfigChoice((), "in-cluster service account")
    raise KubeconfigError("kubeconfig", f"none found (no --stack, KUBECONFIG or ~/.kube/config): {hint} "
                                        "and pass --stack <stack>")


def load_kubernetes_config(choice: KubeconfigChoice, context: str | None) -> None:
    """Configure the kubernetes client for `choice` (imports the client only here: resolution stays pure)."""
    import yaml
    from kubernetes import config

    try:
        if choice.in_cluster:
            config.load_incluster_config()
        else:
            # The client merges a path list the way kubectl merges KUBECONFIG.
            config.load_kube_config(config_file=os.pathsep.join(choice.files), context=context)
    except UnicodeDecodeError as exc:
        raise KubeconfigError(_where(choice), f"is not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    except yaml.YAMLError as exc:
        raise KubeconfigError(_where(choice), f"is not YAML: {_first_line(exc)}") from None
    except RecursionError:
        raise KubeconfigError(_where(choice), "is nested too deeply to be a kubeconfig") from None
    except (TypeError, AttributeError, KeyError, IndexError):  # the client indexes whatever the YAML holds
        raise KubeconfigError(_where(choice), "not a kubeconfig (a YAML mapping with clusters, contexts and "
                                              "users)") from None
    except (config.ConfigException, OSError, ValueError) as exc:
        raise KubeconfigError(_where(choice), _first_line(exc)) from None


def _where(choice: KubeconfigChoice) -> str:
    return choice.files[0] if choice.files else choice.source


def _first_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) if str(exc) else type(exc).__name__
