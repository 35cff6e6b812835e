"""Rolling new certificates onto the etcd members: one member at a time, behind the health gates.

The members' server and peer certificates are Pulumi's: `pulumi up`
re-issues them inside their last 90 days into each member's secret in the
cloud's secret store, and a member reads that secret at boot
(`corral-fetch-secrets`). A running member keeps presenting the old
certificate until it fetches the new one and restarts etcd; its data stays.
`corral upgrade CLUSTER --renew-certs --etcd-members` does that per member
whose presented certificate is due (or every member with `--force-renew`),
over the operator's ssh (corral.etcd.restore's `Ssh`/`Remote`, as
`corral etcd restore --all`), with issue 13's gates:

  gate     every member started, healthy and caught up, one leader
  leader   a member that leads hands leadership to a healthy one first
           (`move-leader`), so its restart stalls no write
  restart  `corral-fetch-secrets && systemctl restart etcd` on the member
  gate     the member healthy and caught up again, the whole cluster healthy
  check    the member now presents a certificate that is not due (else:
           `pulumi up` has not re-issued it yet - the run stops there)

Nothing is kept between runs: a re-run reads what the members present and
restarts only those still due.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from corral.etcd import Etcdctl, EtcdError, require_healthy
from corral.etcd.lifecycle import wait_healthy
from corral.machine.secret_fetch import FETCH_SCRIPT

RESTART = f"{FETCH_SCRIPT}\nsystemctl restart etcd"


def roll_etcd_members(
    ctl: Etcdctl, names: Sequence[str], restart: Callable[[str], None],
    still_due: Callable[[str], str], wait_timeout: float = 300,
    on_step: Callable[[str, str], None] = lambda member, step: None,
) -> list[str]:
    """Restart `names` one at a time behind the gates; the members done, in order.

    `restart(name)` runs RESTART on the member; `still_due(name)` says why its
    presented certificate is still due ("" when it is not)."""
    done = []
    for name in names:
        on_step(name, "gate: etcd healthy")
        status = require_healthy(ctl, action=f"restart {name}")
        member = next((m for m in status.members if m.name == name), None)
        if member is None:
            raise EtcdError(f"{name} is not a member of the etcd cluster")
        if status.leader is not None and status.leader.id == member.id:
            # To a member already renewed (it stays), else to the one renewed last:
            # leadership moves at most twice in a roll.
            others = [m for m in status.members if m.id != member.id and m.started]
            rank = {n: i for i, n in enumerate(reversed(names))}
            successor = min(others, key=lambda m: (m.name not in done, rank.get(m.name, -1)))
            on_step(name, f"move leadership to {successor.name}")
            ctl.move_leader(successor, member.client_urls[0])
        on_step(name, "fetch its certificate from the secret store, restart etcd")
        restart(name)
        on_step(name, "gate: healthy and caught up")
        wait_healthy(ctl, name, wait_timeout)
        why = still_due(name)
        if why:
            raise EtcdError(f"{name} restarted but {why}: has `pulumi up` re-issued it (it does in the "
                            "certificate's last 90 days)? The other members were not touched")
        done.append(name)
    return done
