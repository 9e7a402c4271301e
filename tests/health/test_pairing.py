"""The EFA pairing decisions over a simulated pool: nodes joining one by one, one bad link between two good nodes, one
bad node, and the label each node ends with."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from workloads.health.pairing import FAILED, PASSED, RECHECK, UNPAIRED, PairState, join, labels, plan_pairs, record

Link = Callable[[str, str], bool]


def run(order: list[str], link_ok: Link, rounds: int = 10) -> dict[str, PairState]:
    """Nodes join in `order`; after each join, every planned pair test runs (its result from `link_ok`) until
    there is nothing left to plan."""
    pool: dict[str, PairState] = {}
    for node in order:
        pool = join(pool, node)
        for _ in range(rounds):
            pairs = plan_pairs(pool)
            if not pairs:
                break
            for pair in pairs:
                pool = record(pool, pair, link_ok(*pair))
    return pool


def test_the_first_node_is_passed_on_its_local_checks_and_tested_when_a_peer_arrives() -> None:
    pool = join({}, "a")
    assert plan_pairs(pool) == [] and labels(pool) == {"a": "passed"} and pool["a"].status == UNPAIRED
    pool = join(pool, "b")
    assert plan_pairs(pool) == [("a", "b")]
    pool = record(pool, ("a", "b"), True)
    assert {n: s.status for n, s in pool.items()} == {"a": PASSED, "b": PASSED}


def test_a_healthy_pool_ends_all_passed() -> None:
    pool = run(["n1", "n2", "n3", "n4", "n5"], lambda a, b: True)
    assert labels(pool) == dict.fromkeys(["n1", "n2", "n3", "n4", "n5"], "passed")
    assert all(state.status == PASSED for state in pool.values())


def test_one_bad_link_between_good_nodes_costs_a_recheck_not_a_node() -> None:
    bad = frozenset({"n1", "n2"})
    pool = run(["n1", "n2", "n3", "n4"], lambda a, b: frozenset({a, b}) != bad)
    assert labels(pool) == dict.fromkeys(["n1", "n2", "n3", "n4"], "passed")
    assert pool["n1"].failed_with == {"n2"} and pool["n2"].failed_with == {"n1"}


def test_a_bad_node_fails_with_two_peers_and_its_peers_pass_with_others() -> None:
    pool = run(["n1", "bad", "n3", "n4", "n5"], lambda a, b: "bad" not in (a, b))
    assert labels(pool) == {"bad": "failed", "n1": "passed", "n3": "passed", "n4": "passed", "n5": "passed"}
    assert len(pool["bad"].failed_with) == 2


def test_a_node_that_failed_once_waits_in_recheck_until_another_peer_arrives() -> None:
    pool = run(["n1", "n2"], lambda a, b: False)
    assert {n: s.status for n, s in pool.items()} == {"n1": RECHECK, "n2": RECHECK}
    assert labels(pool) == {"n1": "recheck", "n2": "recheck"} and plan_pairs(pool) == []
    pool = join(pool, "n3")  # n2 is the bad one
    while pairs := plan_pairs(pool):
        for pair in pairs:
            pool = record(pool, pair, "n2" not in pair)
    assert labels(pool) == {"n1": "passed", "n2": "failed", "n3": "passed"}


@settings(max_examples=60, deadline=None)
@given(size=st.integers(min_value=2, max_value=8), bad=st.sets(st.integers(min_value=0, max_value=7), max_size=1),
       order_seed=st.randoms(use_true_random=False))
def test_in_any_join_order_a_pool_with_one_bad_node_fails_it_alone(size: int, bad: set[int], order_seed) -> None:
    nodes = [f"n{i}" for i in range(size)]
    broken = {f"n{i}" for i in bad if i < size}
    order = nodes[:]
    order_seed.shuffle(order)
    pool = run(order, lambda a, b: not ({a, b} & broken), rounds=20)
    healthy = [n for n in nodes if n not in broken]
    if len(healthy) >= 2 or not broken:
        assert {n for n, s in pool.items() if s.status == FAILED} <= broken
        assert all(pool[n].status in (PASSED, RECHECK) for n in healthy)
        # a healthy node is never left failed, and with two healthy peers around every healthy node passes
        if len(healthy) >= 3:
            assert all(pool[n].status == PASSED for n in healthy)
