"""A stand-in for the Pulumi CLI (which cannot be installed here), answering the few commands the acceptance kit
runs the way pulumi v3.259.0 does, its state in the JSON file $FAKE_PULUMI_STATE. The texts are pulumi's own:

- DIY lock: pkg/backend/diy/lock.go:87-106 (`the stack is currently locked by ...`, one line per lock file);
- Pulumi Cloud: the service's 409 as apitype.ErrorResponse.Error (sdk/go/common/apitype/errors.go:73, `[%d] %s`)
  wrapped by backenderr.ConflictingUpdateError (pkg/backend/backenderr/backenderr.go:106-108); the message is the
  one sdk/go/auto/errors.go:50 and the Python SDK's automation/errors.py match;
- `no stack named '%s' found` (backenderr.go:47, exit 6: pkg/cmd/pulumi/cmd/exit_codes.go), other errors exit 1;
- `pulumi cancel`: pkg/cmd/pulumi/cancel/cancel.go (the DIY backend deletes every lock file, backend.go:1684);
- `pulumi stack import` drops pending operations with a warning each (pkg/cmd/pulumi/stack/io.go:555-563);
- `pulumi refresh --clear-pending-creates` drops pending creates (pkg/cmd/pulumi/operations/refresh.go:319-327).

State keys: backend (diy|cloud), exists, lock ({user, host, pid} or null), cloud_update (bool), pending ([{type,
urn}]), refresh_breaks (bool), up_hangs (bool), destroyed (bool), calls (each argv, appended).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

STATE = Path(os.environ["FAKE_PULUMI_STATE"])
CONFLICT = ("error: [409] Conflict: Another update is currently in progress.\nTo learn more about possible reasons "
            "and resolution, visit https://www.pulumi.com/docs/support/troubleshooting/common-issues/update-conflicts/")
DIY = ("error: the stack is currently locked by 1 lock(s). Either wait for the other process(es) to end or delete the "
       "lock file with `pulumi cancel`.\n  file:///home/me/.pulumi/locks/organization/ml-cluster/{stack}/"
       "0a1b2c3d-4e5f-6789-abcd-ef0123456789.json: created by {user}@{host} (pid {pid}) at 2026-11-27T01:02:03Z")


def save(state: dict) -> None:  # type: ignore[type-arg]
    tmp = STATE.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, STATE)


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def locked(state: dict, stack: str) -> bool:  # type: ignore[type-arg]
    if state["backend"] == "cloud" and state.get("cloud_update"):
        print(CONFLICT, file=sys.stderr)
        return True
    if state["backend"] == "diy" and state.get("lock"):
        print(DIY.format(stack=stack, **state["lock"]), file=sys.stderr)
        return True
    return False


def lock(state: dict) -> None:  # type: ignore[type-arg]
    if state["backend"] == "cloud":
        state["cloud_update"] = True
    else:
        state["lock"] = {"user": "me", "host": socket.gethostname(), "pid": os.getpid()}
    save(state)


def unlock(state: dict) -> None:  # type: ignore[type-arg]
    state["cloud_update"], state["lock"] = False, None
    save(state)


def main(argv: list[str]) -> int:
    state = json.loads(STATE.read_text())
    state.setdefault("calls", []).append(" ".join(argv))
    save(state)
    stack = flag(argv, "--stack") or "dev"
    if not state.get("exists", True):
        print(f"error: no stack named '{stack}' found", file=sys.stderr)
        return 6
    words = [word for word in argv if not word.startswith("-")][:2]
    if words == ["stack", "export"]:
        operations = [{"resource": {"urn": op["urn"], "type": op["urn"].split("::")[-2]}, "type": op["type"]}
                      for op in state.get("pending", [])]
        document = {"version": 3, "deployment": {"manifest": {"time": "2026-11-27T01:02:03Z"}, "resources": [],
                                                 "pending_operations": operations}}
        Path(flag(argv, "--file") or "/dev/stdout").write_text(json.dumps(document, indent=4))
        return 0
    if words[0] == "cancel":
        unlock(state)
        print(f"The currently running update for '{stack}' has been canceled!")
        return 0
    if locked(state, stack):
        return 1
    if words == ["stack", "import"]:
        for op in state.get("pending", []):
            print(f"warning: removing pending operation '{op['type']}' on '{op['urn']}' from snapshot",
                  file=sys.stderr)
        state["pending"] = []
        save(state)
        return 0
    if words[0] == "refresh":
        if state.get("refresh_breaks"):
            print("error: Preview failed: configured Kubernetes cluster is unreachable: unable to load schema "
                  "information from the API server", file=sys.stderr)
            return 1
        print(f"Refreshing ({stack})")
        state["pending"] = [] if "--clear-pending-creates" in argv else [
            op for op in state.get("pending", []) if op["type"] == "creating"]
        save(state)
        return 0
    if words[0] in ("up", "destroy"):
        lock(state)
        print(f"{'Updating' if words[0] == 'up' else 'Destroying'} ({stack})", flush=True)
        if words[0] == "up" and state.get("up_hangs"):
            state["pending"] = [{"type": "creating",
                                 "urn": f"urn:pulumi:{stack}::ml-cluster::aws:eks/cluster:Cluster::ml-{stack}"}]
            save(state)
            time.sleep(60)  # killed here by the runner's deadline: the lock and the pending create stay
        state["destroyed"] = words[0] == "destroy"
        unlock(state)
        return 0
    print(f"error: fake pulumi: {' '.join(argv)}: not one the kit runs", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
