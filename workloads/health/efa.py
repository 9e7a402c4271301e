"""EFA presence on a node: the interfaces the kernel shows and whether libfabric's EFA provider opens them.

The count comes from sysfs (`/sys/class/infiniband/<dev>/device/driver` -> `efa`), which a container sees without
claiming `vpc.amazonaws.com/efa` (a DaemonSet that claimed it would hold the interfaces for its whole life and
starve the training pods). `fi_info -p efa` (libfabric, from AWS's EFA installer in the training image) needs the
device nodes, so the burn-in's EFA container runs privileged; without them it lists no provider.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from workloads.train.memlock import memlock_limit

SYSFS = Path("/sys/class/infiniband")
FI_INFO = "/opt/amazon/efa/bin/fi_info"
MAX_DEVICES = 64


def efa_interfaces(sysfs: Path = SYSFS) -> int:
    """RDMA devices whose driver is efa. Reads link names only: nothing in sysfs is followed or opened."""
    try:
        names = sorted(os.listdir(sysfs))[:MAX_DEVICES]
    except OSError:
        return 0
    count = 0
    for name in names:
        try:
            driver = os.readlink(sysfs / name / "device" / "driver")
        except OSError:
            continue
        if os.path.basename(driver) == "efa":
            count += 1
    return count


def provider_listed(output: str) -> bool:
    """`fi_info -p efa` prints `provider: efa` for each endpoint it can open."""
    return any(line.strip() == "provider: efa" for line in output.splitlines())


def efa_check(fi_info: str = FI_INFO, sysfs: Path = SYSFS, timeout: float = 60) -> dict[str, object]:
    result = _provider_check(fi_info, sysfs, timeout)
    limit = memlock_limit()  # the container runtime's limit: every container on the node gets the same
    result["memlock_unlimited"] = limit is None
    result["memlock_kib"] = None if limit is None else limit // 1024
    return result


def _provider_check(fi_info: str, sysfs: Path, timeout: float) -> dict[str, object]:
    interfaces = efa_interfaces(sysfs)
    try:
        completed = subprocess.run([fi_info, "-p", "efa"], capture_output=True, text=True, timeout=timeout,
                                   check=False)
    except FileNotFoundError:
        return {"interfaces": interfaces, "provider_ok": False, "error": f"{fi_info} not found (EFA installer "
                                                                          "missing from the image)"}
    except subprocess.TimeoutExpired:
        return {"interfaces": interfaces, "provider_ok": False, "error": f"fi_info ran over {timeout:g}s"}
    ok = completed.returncode == 0 and provider_listed(completed.stdout)
    error = None if ok else f"fi_info exit {completed.returncode}: {' '.join(completed.stderr.split())[:200]}"
    return {"interfaces": interfaces, "provider_ok": ok, "error": error}
