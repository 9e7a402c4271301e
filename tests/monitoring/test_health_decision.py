"""The node decision (infra/monitoring/health.py) on timelines: fatal, benign, flapping, concurrent, repeated."""

from __future__ import annotations

from infra.monitoring.health import Observation, decide

GPU = "AcceleratedHardwareReady"


def test_a_quiet_node_is_left_alone() -> None:
    assert decide([Observation(m) for m in range(0, 60, 5)], now=60).action == "ignore"


def test_a_fatal_xid_replaces_even_after_the_gpu_goes_quiet() -> None:
    timeline = [Observation(0), Observation(5, xids=(79,)), *[Observation(m) for m in range(10, 60, 5)]]
    decision = decide(timeline, now=55)
    assert decision.action == "replace" and decision.reasons == ("XID 79: replace",)
    assert decide(timeline, now=5 + 61).action == "ignore"  # out of the window: history, not a fault


def test_application_xids_stay_quiet_below_the_limit_and_drain_above() -> None:
    few = [Observation(m, xids=(13,)) for m in range(0, 40, 10)]  # 4
    assert decide(few, now=40).action == "ignore"
    many = few + [Observation(45, xids=(31, 13))]  # 13 x5
    assert decide(many, now=45).action == "drain"


def test_a_reset_that_does_not_help_escalates_to_replace() -> None:
    assert decide([Observation(0, xids=(119,))], now=1).action == "reset"
    assert decide([Observation(0, xids=(119,)), Observation(20, xids=(119,))], now=21).action == "replace"


def test_a_flapping_condition_drains_whatever_its_state_now() -> None:
    flapping = []
    for start in (0, 10, 20):  # unhealthy for 3 minutes, healthy again: never the 10 EKS waits
        flapping += [Observation(start, {GPU: "DCGMHealthCode12"}), Observation(start + 3)]
    decision = decide(flapping, now=25)
    assert decision.action == "drain" and "flapped x3" in decision.reasons[0]
    assert decide(flapping[:4], now=15).action == "ignore"  # twice is not yet a flap


def test_concurrent_faults_take_the_strongest_action_and_report_each() -> None:
    timeline = [Observation(0, {GPU: "NvidiaXID119Error", "KernelReady": "SoftLockup"}, xids=(119, 13)),
                Observation(5, {GPU: "NvidiaXID79Error", "KernelReady": "SoftLockup"}, xids=(79,))]
    decision = decide(timeline, now=5)
    assert decision.action == "replace"
    assert {"XID 79: replace", "XID 119: reset", f"{GPU}/NvidiaXID79Error: replace",
            "KernelReady/SoftLockup: drain"} <= set(decision.reasons)


def test_an_unknown_xid_or_reason_drains() -> None:
    assert decide([Observation(0, xids=(999,))], now=1).reasons == ("XID 999 (not in the table): drain",)
    assert decide([Observation(0, {GPU: "NvidiaPowerError"})], now=1).action == "drain"


def test_the_agents_reboot_reasons_map_to_reset() -> None:
    assert decide([Observation(0, {GPU: "NvidiaXID120Error"})], now=1).action == "reset"
