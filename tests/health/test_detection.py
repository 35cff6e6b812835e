"""Fast detection (issue 27, item 1): each fault the issue names reaches the
corral.dev/unhealthy taint, with the right effect, from the real agent in real
time against the fake API server (detectlab.py). Only correctness is asserted
here; how fast is benchmarks/bench_detection.py's business.

Kernel-log faults are tested with a round that never comes again
(interval_seconds an hour): the agent must act on the record as it is
written. The agent before issue 27 read the kernel log only in its rounds and
fails them.
"""

from __future__ import annotations

import errno

import pytest

from corral.health import addon

from .conftest import cluster
from .detectlab import FAULTS, DetectionLab

HOUR = 3600.0
PATIENCE = 20.0      # generous: this machine is shared; the benchmark measures


@pytest.fixture
def lab(tmp_path):
    made = []

    def make(**kwargs) -> DetectionLab:
        made.append(DetectionLab(tmp_path / f"lab{len(made)}", **kwargs))
        return made[-1]

    yield make
    for one in made:
        one.stop()


def settled(lab: DetectionLab) -> None:
    """The agent listed its node and wrote its first conditions (no fault)."""
    lab.start_agent()
    assert lab.wait(lambda: lab.condition("GPUPreflightPassed") is not None, PATIENCE)
    assert lab.taint() is None


@pytest.mark.parametrize("kind,condition,effect", [(k, c, e) for k, where, c, e in FAULTS if where == "kmsg"])
def test_a_kernel_log_fault_is_tainted_as_it_is_written_not_at_the_next_round(lab, kind, condition, effect):
    node = lab(interval_seconds=HOUR)
    settled(node)
    node.inject(kind)
    assert node.wait(lambda: node.taint() is not None, PATIENCE), f"{kind}: no taint without a round"
    assert (node.taint()["value"], node.taint()["effect"]) == (condition, effect)
    # The taint first (it keeps work away), then the conditions that say why.
    assert node.wait(lambda: (node.condition(condition) or {}).get("status") == "True", PATIENCE)
    # Kept for this boot (the ring buffer wraps, the agent restarts; the GPU does not heal).
    assert condition in (node.host / "faults.json").read_text()


def test_application_xids_do_not_taint_and_a_fatal_one_after_them_does(lab):
    node = lab(interval_seconds=HOUR)
    settled(node)
    for code in (13, 31, 43):
        node.xid(code)
    node.xid(79)          # written after them: once it is tainted, the agent has read the three before it
    assert node.wait(lambda: (node.condition("GPUXidFault") or {}).get("status") == "True", PATIENCE)
    assert node.wait(lambda: "GPUUnhealthy" in {e["reason"] for e in node.cluster.objects["events"].values()},
                     PATIENCE)
    assert node.taint() is not None
    xid = node.condition("GPUXidFault")
    assert (xid["status"], xid["reason"]) == ("True", "Xid79")
    assert not any(f"Xid {code}" in xid["message"] for code in (13, 31, 43))
    assert {e["reason"] for e in node.cluster.objects["events"].values()} >= {"Xid79", "GPUUnhealthy"}
    assert not {e["reason"] for e in node.cluster.objects["events"].values()} & {"Xid13", "Xid31", "Xid43"}


def test_the_backlog_is_read_once_at_start(lab):
    node = lab(interval_seconds=HOUR)
    node.xid(48)          # in the buffer before the agent starts
    node.start_agent()
    assert node.wait(lambda: (node.condition("GPUXidFault") or {}).get("reason") == "Xid48", PATIENCE)
    assert node.taint()["effect"] == "NoExecute"


@pytest.mark.parametrize("kind,condition,effect", [(k, c, e) for k, where, c, e in FAULTS if where != "kmsg"])
def test_a_device_fault_is_tainted_at_the_next_round(lab, kind, condition, effect):
    node = lab(interval_seconds=0.2)
    settled(node)
    node.inject(kind)
    assert node.wait(lambda: node.taint() is not None, PATIENCE)
    assert (node.taint()["value"], node.taint()["effect"]) == (condition, effect)


@pytest.mark.parametrize("kind", ["nvlink-down", "roce-port-down"])
def test_nvlink_and_roce_count_only_on_pools_that_have_them(lab, kind):
    node = lab(interval_seconds=0.2, nvlink=False, roce=False)
    settled(node)
    node.inject(kind)
    node.xid(79)          # a fault that does count, to know the agent has looked since
    assert node.wait(lambda: node.taint() is not None, PATIENCE)
    node.wait(lambda: False, 1.0)          # five more rounds
    assert node.condition("GPUNVLinkFault")["status"] == "False"
    assert node.condition("RoCELinkFault")["status"] == "False"


def test_writes_stay_one_per_change_with_the_short_round(lab):
    node = lab(interval_seconds=0.05)
    settled(node)
    node.inject("roce-port-down")
    assert node.wait(lambda: (node.condition("RoCELinkFault") or {}).get("status") == "True", PATIENCE)
    node.wait(lambda: False, 0.5)          # the change's taint, status and events written
    before = len([r for r in node.cluster.requests if r["verb"] != "watch"])
    node.wait(lambda: False, 1.0)          # twenty rounds more
    assert len([r for r in node.cluster.requests if r["verb"] != "watch"]) == before


def test_the_round_is_short_enough_for_the_ten_second_target():
    # The local checks' round bounds how long a device fault (nvidia-smi, a RoCE port) waits.
    assert addon.agent_config(cluster("jaguar"))["interval_seconds"] <= 5


# --- the follower against the kernel's read() semantics ---------------------------------


class FAKE_kmsg:  # noqa: N801  (the device's read(), at the syscall boundary)
    """read() as /dev/kmsg answers it: one record per call, EPIPE once when the
    ring buffer overran the reader (the kernel then moves it to the next record)."""

    def __init__(self, answers: list) -> None:
        self.answers = list(answers)

    def read(self, fd: int, size: int) -> bytes:
        answer = self.answers.pop(0) if self.answers else b""
        if isinstance(answer, OSError):
            raise answer
        return answer


def test_the_follower_goes_on_after_the_ring_buffer_overran_it(agent):
    delivered = []
    follower = agent.KernelLogFollower("/dev/kmsg", delivered.append, lambda: False)
    device = FAKE_kmsg([b"6,10,100,-;eth0: link up\n",
                        OSError(errno.EPIPE, "Broken pipe"),
                        b"4,57,300,-;NVRM: Xid (PCI:0000:2b:00): 79, pid=2213, GPU has fallen off the bus.\n",
                        b" SUBSYSTEM=pci\n"])
    follower._read_until_end(-1, read=device.read)
    assert follower.overruns == 1
    assert delivered == [["4,57,300,-;NVRM: Xid (PCI:0000:2b:00): 79, pid=2213, GPU has fallen off the bus."]]
