"""Which nodes of an EFA pool test their network against which, and what each ends labelled: pure decisions.

A node's local checks (DCGM, GPUs, its own all-reduce, EFA present, locked memory) say nothing about whether its EFA
moves bytes to another node. So a node that passed them is paired with another passed node of its pool for a short
2-node all-reduce against the type's floor (workloads/train/allreduce.py) before it is `passed` for training:

- the first node of a pool has no peer: it is labelled `passed` on its local checks, and paired when a peer arrives;
- a pair that reaches the floor passes both nodes;
- a pair that does not puts both into `recheck`; each is paired again with another peer (never the one it failed
  with); a node that then passes is `passed`, a node that fails with a second, different peer is `failed` (the
  link that failed once is the other node's fault, the node that fails twice is its own);
- a node with nobody left to pair with stays where it is until a peer arrives (`recheck` nodes are not schedulable).

The burn-in records each node's state in its labels; `plan_pairs` and `record` are what a coordinator runs on them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

UNPAIRED = "unpaired"  # passed its local checks, no pair test yet (schedulable: the label says passed)
PASSED = "passed"  # passed a pair test
RECHECK = "recheck"  # failed one pair test: not schedulable until a second peer says which side is at fault
FAILED = "failed"  # failed pair tests with two different peers

LABELS = {UNPAIRED: "passed", PASSED: "passed", RECHECK: "recheck", FAILED: "failed"}


@dataclass(frozen=True)
class PairState:
    status: str = UNPAIRED
    failed_with: frozenset[str] = field(default_factory=frozenset)


Pool = Mapping[str, PairState]


def join(pool: Pool, node: str) -> dict[str, PairState]:
    """A node that passed its local checks enters its pool's pairing."""
    return {**pool, node: pool.get(node, PairState())}


def plan_pairs(pool: Pool) -> list[tuple[str, str]]:
    """The pair tests to run now: nodes waiting on one (recheck first, then unpaired), each with a peer it has not
    failed with, preferring another waiting node, then a passed one. A node is in at most one pair; deterministic
    (sorted by name)."""
    waiting = sorted((n for n, s in pool.items() if s.status in (RECHECK, UNPAIRED)),
                     key=lambda n: (pool[n].status != RECHECK, n))
    busy: set[str] = set()
    pairs = []
    for node in waiting:
        if node in busy:
            continue
        candidates = [peer for peer in sorted(pool) if peer != node and peer not in busy
                      and pool[peer].status != FAILED and peer not in pool[node].failed_with
                      and node not in pool[peer].failed_with]
        candidates.sort(key=lambda peer: pool[peer].status not in (RECHECK, UNPAIRED))
        if candidates:
            busy |= {node, candidates[0]}
            pairs.append((node, candidates[0]))
    return pairs


def record(pool: Pool, pair: tuple[str, str], reached_floor: bool) -> dict[str, PairState]:
    """The pool after a pair test's result."""
    updated = dict(pool)
    first, second = pair
    for node, peer in ((first, second), (second, first)):
        state = pool[node]
        if reached_floor:
            updated[node] = replace(state, status=PASSED)
        elif state.failed_with - {peer}:
            updated[node] = replace(state, status=FAILED, failed_with=state.failed_with | {peer})
        else:
            updated[node] = replace(state, status=RECHECK, failed_with=state.failed_with | {peer})
    return updated


def labels(pool: Pool) -> dict[str, str]:
    """The gpu-health label each node carries."""
    return {node: LABELS[state.status] for node, state in sorted(pool.items())}
