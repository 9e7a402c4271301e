"""python -m workloads.train.launch [torchrun options] -m workloads.train ...: torchrun, with exit codes for Jobs.

torchrun itself exits 1 whatever its workers exited with, so a Job's podFailurePolicy could not tell a config error
(fail the Job) from a disruption (retry, not counted) from a crash (retry, counted). This runs torchrun in-process
(torch.distributed.run.main, the same code and options) and maps its outcome:

- every worker succeeded: 0
- a worker exited with the config-error code: that code ($CONFIG_ERROR_EXIT_CODE)
- the agent got SIGTERM/SIGINT (the kubelet stops the pod): it sent the workers SIGTERM, they wrote a last
  checkpoint and stopped; or every failed worker exited with the disruption code (stopped, or a peer rank lost);
  or the rendezvous failed or its store went away (the node that hosted it is gone): the disruption code
  ($DISRUPTION_EXIT_CODE)
- the rendezvous is closed (the rest of the gang finished or gave up, so a replacement can never join it): 1, which
  the Job counts, so such a pod is not replaced forever
- anything else (a worker crashed, was killed by a signal other than the agent's own SIGTERM, the agent failed):
  1

Workers the agent stopped itself with SIGTERM after another worker failed are not a cause. The agent gives its
workers TORCH_ELASTIC_SHUTDOWN_TIMEOUT seconds (the rendered Jobs size it below terminationGracePeriodSeconds)
between its SIGTERM and a SIGKILL.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterable

from workloads.train.exitcodes import RUNTIME_EXIT_CODE, config_error_exit_code, disruption_exit_code
from workloads.train.memlock import efa_memlock_error, memlock_limit, memlock_line


def exit_code_for(worker_codes: Iterable[int]) -> int:
    """The pod's exit code for the exit codes of the failed workers (negative: killed by that signal)."""
    causes = [code for code in worker_codes if code != -signal.SIGTERM]  # -15: stopped by the agent itself
    if config_error_exit_code() in causes:
        return config_error_exit_code()
    if all(code == disruption_exit_code() for code in causes):  # none left: the agent stopped them all
        return disruption_exit_code()
    return RUNTIME_EXIT_CODE


def main(argv: list[str] | None = None) -> int:
    limit = memlock_limit()
    print(f"launch: {memlock_line(limit)}", file=sys.stderr)
    refused = efa_memlock_error(os.environ, limit)
    if refused:  # before torch is imported: a pod that cannot run says so at once
        print(f"error: {refused}", file=sys.stderr)
        return config_error_exit_code()

    from torch.distributed import DistError
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import (
        RendezvousClosedError,
        RendezvousError,
        RendezvousGracefulExitError,
    )
    from torch.distributed.run import main as torchrun

    try:
        torchrun(argv)
    except ChildFailedError as exc:
        code = exit_code_for(failure.exitcode for failure in exc.failures.values())
        print(f"launch: workers failed ({', '.join(str(f.exitcode) for f in exc.failures.values())}): exit {code}",
              file=sys.stderr)
        return code
    except SignalException as exc:
        print(f"launch: stopped by {exc.sigval.name}; the workers were asked to checkpoint and stop",
              file=sys.stderr)
        return disruption_exit_code()
    except RendezvousGracefulExitError:
        return 0
    except RendezvousClosedError:  # the others closed the gang's rendezvous (finished, or gave up): cannot rejoin
        print("launch: the gang's rendezvous is closed; a retry cannot rejoin it", file=sys.stderr)
        return RUNTIME_EXIT_CODE
    except (RendezvousError, DistError) as exc:  # the rendezvous' store (on a node of the gang) is gone
        print(f"launch: rendezvous lost ({type(exc).__name__}): {str(exc).splitlines()[0] if str(exc) else ''}",
              file=sys.stderr)
        return disruption_exit_code()
    return 0


if __name__ == "__main__":
    sys.exit(main())
