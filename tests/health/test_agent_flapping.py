"""The agent's hold-down of device faults (issue 27 follow-up: flapping faults found by the fault suite).

A RoCE port down 20 s of every minute used to be tainted and lifted at every flap, so the repair
controller (which waits for a taint to stand 30 s) never repaired it. These tests drive the pure
decision, agent.hold_down; tests/health/faultlab (case "flapping") runs it through the whole loop.
"""

from __future__ import annotations

import pytest

from corral.health import classify

BOOT = "boot-1/"


@pytest.fixture
def ROCE(agent):
    # The agent's own classify (it is loaded beside it, as in its pod): its Fault class.
    return agent.classify.Fault("RoCEUnhealthy", "RoCEPortDown", "mlx5_0 port 1 is DOWN", classify.FATAL)


def rounds(agent, timeline, epoch=BOOT, state=None):
    """Run hold_down over [(t, faults now)], returning [(t, faults to act on)] and the last state."""
    seen = []
    for t, current in timeline:
        state, faults = agent.hold_down(state, epoch, t, current)
        seen.append((t, faults))
    return seen, state


def test_a_cleared_fault_is_held_down_then_lifted(agent, ROCE):
    seen, _ = rounds(agent, [(0, [ROCE]), (20, []), (25, []), (20 + agent.HOLD_DOWN_SECONDS - 1, []),
                             (20 + agent.HOLD_DOWN_SECONDS, [])])
    assert seen[0][1] == [ROCE]                      # present: as the node says it
    held = seen[1][1]
    assert [(f.condition, f.reason, f.severity) for f in held] == [(ROCE.condition, ROCE.reason, ROCE.severity)]
    assert "held down until" in held[0].message and held[0].message.startswith(ROCE.message)
    # The same fault every round while held: no status write per round.
    assert seen[2][1] == held and seen[3][1] == held
    assert seen[4][1] == []                          # quiet for the whole hold-down: lifted


def test_a_fault_that_keeps_coming_back_is_held_as_flapping_until_a_repair(agent, ROCE):
    # Down 20 s, then up for longer than the hold-down each time: without the count it would be lifted
    # between flaps; on its third onset within the window it is flapping and stays.
    gap = agent.HOLD_DOWN_SECONDS + 60
    timeline = []
    for n in range(agent.FLAP_ONSETS):
        start = n * (gap + 20)
        timeline += [(start, [ROCE]), (start + 20, []), (start + 20 + agent.HOLD_DOWN_SECONDS + 1, [])]
    seen, state = rounds(agent, timeline)
    assert seen[2][1] == []                          # the first flap was lifted after its hold-down
    assert seen[-2][1][0].message.startswith(
        f"flapping: {agent.FLAP_ONSETS} faults in {agent.FLAP_WINDOW_SECONDS // 60} minutes")
    assert seen[-1][1] and seen[-1][1][0].reason == ROCE.reason      # past the hold-down: still held
    # Hours later in the same epoch: still held (until a repair, not until the window forgets).
    later, _ = rounds(agent, [(timeline[-1][0] + 10 * 3600, [])], state=state)
    assert later[0][1] and later[0][1][0].message.startswith("flapping:")


def test_a_repair_starts_a_new_epoch_without_hold_down(agent, ROCE):
    _, state = rounds(agent, [(0, [ROCE]), (20, [])])
    # A reboot (new boot id) or a repair the agent reported done: lifted at once (the burn-in that
    # follows the repair decides the node, not the old fault).
    assert rounds(agent, [(30, [])], epoch="boot-2/", state=state)[0][0][1] == []
    epoch = agent.repair_epoch("boot-1", {"id": "r-1", "state": "done"})
    assert epoch != agent.repair_epoch("boot-1", {"id": "r-1", "state": "running"}) == BOOT
    assert rounds(agent, [(30, [])], epoch=epoch, state=state)[0][0][1] == []


def test_a_fault_present_for_long_is_one_onset_not_a_flap(agent, ROCE):
    # Present through a whole window and longer: one onset, never "flapping".
    timeline = [(t, [ROCE]) for t in range(0, 3 * agent.FLAP_WINDOW_SECONDS, 600)]
    seen, state = rounds(agent, timeline)
    assert all(faults == [ROCE] for _, faults in seen)
    assert not state["faults"][f"{ROCE.condition}/{ROCE.reason}"].get("flapping")
