"""Membership changes behind health gates, one member at a time.

etcd's own rules (etcd.io/docs/v3.5/op-guide/runtime-configuration/):
change membership one member at a time, only on a healthy cluster, and
remove a failed member before adding its replacement (adding first grows the
quorum while one member is down). Every operation here:

1. gates: every member started, every endpoint answers a quorum read, one
   leader all agree on, no follower far behind the leader's raft index;
   `require_healthy` says which gate failed and for which member;
2. changes the membership (`member remove` / `member add`);
3. calls `start_member(name, initial_cluster)`: the caller's way of starting
   the member's etcd with `initial-cluster-state: existing` and that
   `initial-cluster` (SSH in the tests, a new machine in the cloud);
4. waits until the new member is started, healthy and caught up.

Writes continue throughout: a replacement removes one voter of N (quorum
of N-1 still holds when the rest are healthy), an addition adds one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .client import EndpointHealth, EndpointStatus, EtcdError, Etcdctl, Member

# A follower this many raft entries behind the leader is not caught up
# (etcd itself refuses to promote learners further behind than 10% of its
# snapshot count; at the 10,000 default, that is 1,000 entries).
MAX_RAFT_LAG = 1000
DEFAULT_WAIT_SECONDS = 180
POLL_SECONDS = 1.0

StartMember = Callable[[str, str], None]


def quorum(members: int) -> int:
    return members // 2 + 1


@dataclass(frozen=True)
class ClusterStatus:
    """What `corral etcd status` prints: members, their health and raft position."""

    members: list[Member]
    statuses: list[EndpointStatus]
    health: list[EndpointHealth]

    def status_of(self, member: Member) -> EndpointStatus | None:
        return next((s for s in self.statuses if s.member_id == member.id), None)

    def health_of(self, member: Member) -> EndpointHealth | None:
        urls = set(member.client_urls)
        return next((h for h in self.health if h.endpoint in urls), None)

    @property
    def leaders(self) -> set[int]:
        return {s.leader for s in self.statuses if s.leader}

    @property
    def leader(self) -> Member | None:
        leaders = self.leaders
        if len(leaders) != 1:
            return None
        return next((m for m in self.members if m.id in leaders), None)

    def problems(self, ignore: frozenset[int] = frozenset()) -> list[str]:
        """Why the cluster is not healthy, one line per problem; empty when it is."""
        found = []
        if len(self.leaders) != 1:
            found.append(f"members disagree on the leader or have none ({len(self.leaders)} leaders seen)")
        top = max((s.raft_index for s in self.statuses), default=0)
        for member in self.members:
            if member.id in ignore:
                continue
            label = member.name or f"unstarted member {member.hex_id} ({', '.join(member.peer_urls)})"
            if not member.started:
                found.append(f"{label} has been added but has not started")
                continue
            health = self.health_of(member)
            if health is None or not health.healthy:
                found.append(f"{label} is unhealthy: {(health.error if health else '') or 'no answer'}")
                continue
            status = self.status_of(member)
            if status is None:
                found.append(f"{label} does not report its status")
            elif top - status.raft_index > MAX_RAFT_LAG:
                found.append(f"{label} is {top - status.raft_index} raft entries behind")
        return found


def cluster_status(ctl: Etcdctl) -> ClusterStatus:
    """Members (through any endpoint), then each started member's own status and health."""
    members = ctl.members()
    endpoints = [url for m in members for url in m.client_urls[:1]] or list(ctl.endpoints)
    return ClusterStatus(members, ctl.endpoint_status(endpoints), ctl.endpoint_health(endpoints))


def require_healthy(ctl: Etcdctl, ignore: frozenset[int] = frozenset(), action: str = "change membership") -> ClusterStatus:
    """The health gate: raises EtcdError naming every problem, or returns the status."""
    status = cluster_status(ctl)
    problems = status.problems(ignore)
    if problems:
        raise EtcdError(f"refusing to {action}: the etcd cluster is not healthy:\n  " + "\n  ".join(problems))
    return status


def wait_healthy(ctl: Etcdctl, name: str | None, timeout: float = DEFAULT_WAIT_SECONDS) -> ClusterStatus:
    """Until `name` (if given) is a started, healthy, caught-up member and the whole cluster is healthy."""
    deadline = time.monotonic() + timeout
    problems: list[str] = []
    while True:
        try:
            status = cluster_status(ctl)
            problems = status.problems()
            if name is not None and not any(m.name == name for m in status.members):
                problems.append(f"{name} is not a member yet")
            if not problems:
                return status
        except EtcdError as err:
            problems = [str(err)]
        if time.monotonic() > deadline:
            what = f"{name} did not become a healthy member" if name else "the cluster did not become healthy"
            raise EtcdError(f"{what} within {timeout:.0f} s:\n  " + "\n  ".join(problems))
        time.sleep(POLL_SECONDS)


@dataclass
class Change:
    """What one membership change did, and how long each step took (seconds)."""

    action: str
    member: str
    steps: list[tuple[str, float]] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(t for _, t in self.steps)

    def timed(self, step: str, fn: Callable[[], object]) -> object:
        start = time.monotonic()
        result = fn()
        self.steps.append((step, time.monotonic() - start))
        return result


# etcd's strict reconfiguration check refuses a membership change ("unhealthy
# cluster") until the leader has heard from the remaining voters for 5 s
# (etcdserver HealthInterval): right after a leader change, wait that out.
RECONFIG_RETRY_SECONDS = 20


def _reconfigure(fn: Callable[[], object]) -> object:
    deadline = time.monotonic() + RECONFIG_RETRY_SECONDS
    while True:
        try:
            return fn()
        except EtcdError as err:
            if "unhealthy cluster" not in str(err) or time.monotonic() > deadline:
                raise
        time.sleep(POLL_SECONDS)


def _by_name(members: list[Member], name: str) -> Member:
    for member in members:
        if member.name == name:
            return member
    raise EtcdError(f"no etcd member named {name} (members: {', '.join(m.name or m.hex_id for m in members)})")


def replace_member(ctl: Etcdctl, name: str, peer_url: str, start_member: StartMember,
                   timeout: float = DEFAULT_WAIT_SECONDS) -> Change:
    """Replace member `name` by a new one of the same name at `peer_url` (its
    machine or disk was replaced: the new member starts with an empty data dir).

    Gate: every OTHER member healthy (the one replaced may be dead), so the
    quorum of the smaller cluster holds. A leader being replaced hands its
    leadership to a healthy member first, so no election stalls writes.
    """
    change = Change("replace", name)
    _leave(ctl, change, name)
    _, initial_cluster = change.timed("member add", lambda: _reconfigure(lambda: ctl.member_add(name, peer_url)))  # type: ignore[misc]
    change.timed("start member", lambda: start_member(name, initial_cluster))
    change.timed("wait healthy", lambda: wait_healthy(ctl, name, timeout))
    return change


def _leave(ctl: Etcdctl, change: Change, name: str, min_members: int = 1) -> None:
    """Member `name` leaves: gate on every OTHER member (it may be dead), hand its
    leadership to a healthy member first, `member remove`; `ctl` then talks to the others."""
    members = ctl.members()
    old = _by_name(members, name)
    if len(members) - 1 < min_members:
        raise EtcdError(f"refusing to remove {name}: {len(members) - 1} members would be left, "
                        f"and etcd here runs at least {min_members}")
    status = change.timed("health gate", lambda: require_healthy(ctl, frozenset({old.id}), f"{change.action} {name}"))
    if status.leader and status.leader.id == old.id:
        successor = next(m for m in status.members if m.id != old.id and m.started)
        change.timed("move leader", lambda: ctl.move_leader(successor, old.client_urls[0]))
    # Talk to the others from now on: the old member leaves.
    ctl.endpoints = [url for m in members if m.id != old.id for url in m.client_urls[:1]]
    change.timed("member remove", lambda: _reconfigure(lambda: ctl.member_remove(old)))


# The model's rule (corral/model/rules.py): 3 to 7 members, odd. One member at
# a time passes through even counts; below 3 one failure loses the quorum.
MIN_MEMBERS = 3
MAX_MEMBERS = 7


def remove_member(ctl: Etcdctl, name: str, timeout: float = DEFAULT_WAIT_SECONDS,
                  min_members: int = MIN_MEMBERS) -> Change:
    """Shrink by one: the others must all be healthy (so the smaller cluster keeps
    its quorum; the member removed may be dead), never below `min_members`."""
    change = Change("remove", name)
    _leave(ctl, change, name, min_members)
    change.timed("wait healthy", lambda: wait_healthy(ctl, None, timeout))
    return change


def add_member(ctl: Etcdctl, name: str, peer_url: str, start_member: StartMember,
               timeout: float = DEFAULT_WAIT_SECONDS, max_members: int = MAX_MEMBERS) -> Change:
    """Add one member behind the health gate and wait until it has caught up."""
    change = Change("add", name)
    status = change.timed("health gate", lambda: require_healthy(ctl, action=f"add {name}"))
    if any(m.name == name for m in status.members):
        raise EtcdError(f"{name} is already a member")
    if len(status.members) >= max_members:
        raise EtcdError(f"refusing to add {name}: the cluster has {len(status.members)} members, "
                        f"at most {max_members} here")
    _, initial_cluster = change.timed("member add", lambda: _reconfigure(lambda: ctl.member_add(name, peer_url)))  # type: ignore[misc]
    change.timed("start member", lambda: start_member(name, initial_cluster))
    change.timed("wait healthy", lambda: wait_healthy(ctl, name, timeout))
    return change


def grow(ctl: Etcdctl, new_members: list[tuple[str, str]], start_member: StartMember,
         timeout: float = DEFAULT_WAIT_SECONDS) -> list[Change]:
    """Add `(name, peer_url)` members one at a time, each behind the health gate."""
    return [add_member(ctl, name, peer_url, start_member, timeout) for name, peer_url in new_members]
