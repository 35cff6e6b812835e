"""`health.autoRepair` in the cluster file (corral/model/auto_repair.py): safe defaults, and bad
values are errors naming the file, line and field, never a traceback. Fails on the old model
(no autoRepair: an unknown key)."""

from __future__ import annotations

from corral.model.schema import Health
from tests.model.helpers import example, problems


def test_defaults_are_on_and_bounded():
    repair = Health().auto_repair
    assert repair.enabled is True
    assert (repair.max_unavailable_percent, repair.max_repairs_per_hour, repair.drain_timeout_minutes) == (10, 5, 30)
    assert (repair.circuit_breaker.faulty_percent, repair.circuit_breaker.window_minutes,
            repair.circuit_breaker.min_nodes) == (20, 10, 3)
    assert (repair.repeat_offender.faults, repair.repeat_offender.days) == (3, 30)
    assert (repair.rack.unhealthy_percent, repair.rack.window_minutes) == (50, 10)


def test_bad_values_name_file_line_and_field(tmp_path):
    lines = len(example("jaguar").splitlines())
    text = example("jaguar") + ("health:\n  autoRepair:\n    maxUnavailablePercent: 0\n"
                                "    circuitBreaker: {faultyPercent: 150, windowMinute: 3}\n")
    assert problems(tmp_path, {"jaguar.yaml": text}) == [
        f"jaguar.yaml:{lines + 3}:5: health.autoRepair.maxUnavailablePercent: must be greater than or equal to 1",
        (f"jaguar.yaml:{lines + 4}:22: health.autoRepair.circuitBreaker.faultyPercent: must be less than or "
         "equal to 100"),
        (f"jaguar.yaml:{lines + 4}:42: health.autoRepair.circuitBreaker.windowMinute: unknown key "
         "'windowMinute' (did you mean 'windowMinutes'?)"),
    ]


def test_a_cluster_file_can_turn_it_off(tmp_path):
    text = example("jaguar") + "health:\n  autoRepair:\n    enabled: false\n    rack: {unhealthyPercent: 75}\n"
    assert problems(tmp_path, {"jaguar.yaml": text}) == []
