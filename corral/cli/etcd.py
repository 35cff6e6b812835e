"""`corral etcd status|snapshot|restore|replace|add|remove`: the etcd lifecycle from the operator's seat (docs/etcd.md).

Every command drives etcdctl (corral/etcd/client.py) against the cluster's
member addresses from its layout, with the client certificate given by
--cacert/--cert/--key (env CORRAL_ETCD_CACERT, CORRAL_ETCD_CERT, CORRAL_ETCD_KEY).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from .common import (
    DEFAULT_CLUSTERS,
    ClusterArg,
    ClustersOption,
    CorralTyper,
    check_ssh_user_option,
    cluster_or_exit,
    etcdctl_or_exit,
    examples,
    fail,
    out,
)

app = CorralTyper(help="etcd: status, snapshots, restore, member replacement, growing and shrinking (docs/etcd.md).",
                  no_args_is_help=True)

CaOption = Annotated[Optional[Path], typer.Option(envvar="CORRAL_ETCD_CACERT", help="etcd CA certificate.")]
CertOption = Annotated[Optional[Path], typer.Option(envvar="CORRAL_ETCD_CERT", help="etcd client certificate.")]
KeyOption = Annotated[Optional[Path], typer.Option(envvar="CORRAL_ETCD_KEY", help="etcd client key.")]
EndpointsOption = Annotated[Optional[str], typer.Option(
    help="Comma-separated client URLs; default: the members' addresses from the cluster's layout.")]
EventsOption = Annotated[bool, typer.Option("--events", help="The dedicated events etcd cluster.")]


def _members(cluster, events: bool):
    from corral.model.layout import layout

    lay = layout(cluster)
    members = lay.events_members if events else lay.etcd_members
    if not members:
        fail(f"cluster {cluster.name} has no dedicated events etcd cluster (controlPlane.etcd.dedicatedEventsCluster)")
    return members


def _ctl(cluster, events: bool, endpoints: Optional[str], cacert, cert, key):
    from corral.etcd import Tls

    if not (cacert and cert and key):
        fail("etcd needs a client certificate: --cacert, --cert and --key (or CORRAL_ETCD_CACERT, "
             "CORRAL_ETCD_CERT, CORRAL_ETCD_KEY)")
    urls = endpoints.split(",") if endpoints else [f"https://{m.ip}:2379" for m in _members(cluster, events)]
    return etcdctl_or_exit(urls, Tls(str(cacert), str(cert), str(key)))


def _size(n: int) -> str:
    return f"{n / 1024**2:.1f} MiB"


@app.command(epilog=examples(
    "corral etcd status jaguar",
    "corral etcd status jaguar --events",
))
def status(name: ClusterArg, clusters: ClustersOption = DEFAULT_CLUSTERS, events: EventsOption = False,
           endpoints: EndpointsOption = None, cacert: CaOption = None, cert: CertOption = None,
           key: KeyOption = None) -> None:
    """Members, leader, health, raft index and database size; exit 1 when the cluster is not healthy."""
    from corral.etcd import EtcdError, cluster_status

    cluster = cluster_or_exit(clusters, name)
    try:
        state = cluster_status(_ctl(cluster, events, endpoints, cacert, cert, key))
    except EtcdError as error:
        fail(str(error))
    table = Table(title=escape(f"etcd of {name}" + (" (events)" if events else "")))
    for column in ("member", "id", "peer URL", "role", "health", "raft index", "db size", "version"):
        table.add_column(column)
    for member in state.members:
        s, h = state.status_of(member), state.health_of(member)
        role = "leader" if s and s.is_leader else ("learner" if member.is_learner else "follower")
        table.add_row(escape(member.name or "(not started)"), member.hex_id, escape(", ".join(member.peer_urls)),
                      role if s else "-", "[green]healthy[/]" if h and h.healthy else "[bold red]unhealthy[/]",
                      str(s.raft_index) if s else "-", _size(s.db_size) if s else "-", s.version if s else "-")
    out.print(table)
    problems = state.problems()
    for problem in problems:
        out.print(f"problem: {problem}", markup=False)
    if problems:
        raise typer.Exit(1)
    out.print(f"{len(state.members)} members, healthy, leader {state.leader.name}", markup=False)


@app.command(epilog=examples(
    "corral etcd snapshot jaguar --out jaguar-etcd.db",
))
def snapshot(name: ClusterArg, output: Annotated[Path, typer.Option("--out", help="Snapshot file to write.",
                                                                      dir_okay=False)],
             clusters: ClustersOption = DEFAULT_CLUSTERS, events: EventsOption = False,
             endpoints: EndpointsOption = None, cacert: CaOption = None, cert: CertOption = None,
             key: KeyOption = None) -> None:
    """Take a snapshot now (from the leader) and verify it, as the scheduled job does."""
    from corral.etcd import EtcdError, cluster_status

    cluster = cluster_or_exit(clusters, name)
    ctl = _ctl(cluster, events, endpoints, cacert, cert, key)
    partial = output.with_name(output.name + ".part")
    try:
        leader = cluster_status(ctl).leader
        endpoint = leader.client_urls[0] if leader and leader.client_urls else None
        ctl.snapshot_save(str(partial), endpoint)
        result = ctl.snapshot_status(str(partial))
    except EtcdError as error:
        partial.unlink(missing_ok=True)
        fail(str(error))
    partial.replace(output)  # only a verified snapshot gets the name
    out.print(f"{output}: revision {result.revision}, {result.total_keys} keys, {_size(result.total_size)}",
              markup=False)


def _restore_members(cluster, events: bool, addresses: Optional[list[str]]):
    """The members to rebuild: the layout's, or every NAME=ADDRESS given (all of them)."""
    from corral.etcd.restore import RestoreMember

    if not addresses:
        return [RestoreMember(m.name, m.ip) for m in _members(cluster, events)]
    members = []
    for item in addresses:
        name, sep, address = item.partition("=")
        if not (sep and name and address):
            fail(f"--member-address {item!r}: expected NAME=ADDRESS (e.g. jaguar-etcd-0=10.0.1.10)")
        members.append(RestoreMember(name, address))
    if len({m.name for m in members}) != len(members):
        fail("--member-address: a member is named twice")
    return members


def _restore_everywhere(cluster, events: bool, snapshot_file: Path, addresses, ssh: str, ssh_user: str,
                        sha256: Optional[str], wipe_healthy: bool, timeout: int) -> None:
    import shlex

    from corral.etcd import EtcdError
    from corral.etcd.restore import Ssh, restore_cluster
    from corral.machine.etcd_member import etcd_cluster_token

    members = _restore_members(cluster, events, addresses)
    out.print(f"restoring {len(members)} members ({', '.join(m.name for m in members)}) from {snapshot_file}",
              markup=False)
    try:
        result = restore_cluster(
            members, snapshot_file, etcd_cluster_token(cluster, events), Ssh(tuple(shlex.split(ssh)), ssh_user),
            expected_sha256=sha256, wipe_healthy=wipe_healthy, timeout=timeout,
            progress=lambda step: out.print(f"  {step}", markup=False),
        )
    except EtcdError as error:
        fail(str(error))
    if result.already_done:
        out.print(f"already restored from this snapshot (sha256 {result.sha256[:12]}..., cluster token "
                  f"{result.token}) and healthy: nothing to do", markup=False)
        return
    for member, kept in result.kept.items():
        out.print(f"{member}: its previous data is kept in {kept}/member (remove it when done)", markup=False)
    steps = ", ".join(f"{step} {seconds:.1f} s" for step, seconds in result.steps)
    out.print(f"restored: revision {result.revision}, {result.total_keys} keys, sha256 {result.sha256}, new cluster "
              f"token {result.token}; {len(members)} members healthy, leader {result.leader}, in "
              f"{result.seconds:.0f} s ({steps})", markup=False)


def _fetch_from_bucket(cluster, events: bool, object_name: str, dest: Path, restore_role: Optional[str],
                       sha256: Optional[str]) -> Optional[str]:
    """Download the snapshot as the cluster's restore identity; the SHA-256 the restore must check."""
    from corral.etcd import EtcdError
    from corral.etcd.snapshot_download import download_snapshot, restore_identity
    from corral.machine.etcd_snapshot import snapshot_location, snapshot_prefix

    if cluster.control_plane.cloud not in ("aws", "gcp", "azure"):
        fail(f"cluster {cluster.name} keeps no snapshots in a cloud bucket")
    try:
        identity = restore_identity(cluster.name, restore_role)
        got = download_snapshot(snapshot_location(cluster), snapshot_prefix(events), object_name, dest, identity)
    except EtcdError as error:
        fail(str(error))
    out.print(f"downloaded {got.object_name} to {got.path} as {identity}"
              + (f" (recorded sha256 {got.sha256})" if got.sha256 else ""), markup=False)
    if sha256 and got.sha256 and sha256.lower() != got.sha256.lower():
        fail(f"--sha256 {sha256} is not the object's recorded sha256 {got.sha256}: which one is meant?")
    return sha256 or got.sha256


@app.command(epilog=examples(
    "corral etcd restore jaguar jaguar-etcd.db --all",
    "corral etcd restore jaguar jaguar-etcd.db --from-bucket latest --all",
))
def restore(name: ClusterArg, snapshot_file: Annotated[Path, typer.Argument(
                help="Snapshot file (from `corral etcd snapshot`, or where --from-bucket downloads to).",
                dir_okay=False)],
            from_bucket: Annotated[Optional[str], typer.Option(
                "--from-bucket", help="Download this object of the cluster's snapshot bucket (or 'latest': the "
                                      "newest) to SNAPSHOT_FILE first, as the restore identity (docs/etcd.md).")] = None,
            restore_role: Annotated[Optional[str], typer.Option(
                help="--from-bucket: the restore identity (role ARN / service account email / Entra object id); "
                     "default: the stack output snapshotRestoreRole.")] = None,
            all_members: Annotated[bool, typer.Option(
                "--all", help="Rebuild the WHOLE cluster over ssh: stop etcd on every member, restore this "
                              "snapshot on each with a new cluster token, start all, wait for health.")] = False,
            member: Annotated[Optional[str], typer.Option(
                help="Without --all: this member's name (e.g. jaguar-etcd-0).")] = None,
            data_dir: Annotated[Optional[Path], typer.Option(
                help="Without --all: where the restored data dir goes (must not exist).")] = None,
            sha256: Annotated[Optional[str], typer.Option(
                help="The SHA-256 the file must have (the bucket object's sha256 metadata; --from-bucket reads it "
                     "itself on AWS and Azure).")] = None,
            ssh: Annotated[str, typer.Option(
                envvar="CORRAL_ETCD_SSH", help="--all: the ssh command and its options "
                                               "(e.g. 'ssh -i key -J bastion').")] = "ssh",
            ssh_user: Annotated[str, typer.Option(
                envvar="CORRAL_ETCD_SSH_USER", callback=check_ssh_user_option, help="--all: ssh user; other than root, commands run "
                                                    "through `sudo -n`.")] = "root",
            member_address: Annotated[Optional[list[str]], typer.Option(
                help="--all: NAME=ADDRESS of every member, instead of the cluster layout's (repeat it).")] = None,
            wipe_healthy: Annotated[bool, typer.Option(
                "--wipe-healthy", help="--all: restore even though the cluster is healthy (loses every write "
                                       "since the snapshot).")] = False,
            timeout: Annotated[int, typer.Option(
                help="--all: seconds to wait for the restored cluster's health.")] = 300,
            clusters: ClustersOption = DEFAULT_CLUSTERS, events: EventsOption = False) -> None:
    """Restore from a snapshot. With --all: rebuild the whole cluster over ssh (quorum lost;
    docs/etcd.md). With --member/--data-dir: only a new data dir for one member, here."""
    from corral.etcd import EtcdError, Etcdctl
    from corral.machine.etcd_member import etcd_cluster_token

    cluster = cluster_or_exit(clusters, name)
    if all_members and (member or data_dir):
        fail("--all rebuilds every member: --member and --data-dir are for one member's data dir")
    if not all_members and not (member and data_dir):
        fail("say what to restore: --all (the whole cluster, over ssh) or --member NAME --data-dir DIR")
    if from_bucket:
        sha256 = _fetch_from_bucket(cluster, events, from_bucket, snapshot_file, restore_role, sha256)
    elif not snapshot_file.is_file():
        fail(f"{snapshot_file} does not exist (to fetch it from the cluster's bucket: --from-bucket OBJECT|latest)")
    if all_members:
        _restore_everywhere(cluster, events, snapshot_file, member_address, ssh, ssh_user, sha256, wipe_healthy,
                            timeout)
        return
    members = _members(cluster, events)
    this = next((m for m in members if m.name == member), None)
    if this is None:
        fail(f"{member} is not a member of {name}'s etcd ({', '.join(m.name for m in members)})")
    if data_dir.exists():
        fail(f"{data_dir} exists: restore into a new directory, then move it in place")
    if sha256:
        from corral.etcd.restore import file_sha256

        actual = file_sha256(snapshot_file)
        if actual != sha256.lower():
            fail(f"{snapshot_file}: SHA-256 {actual} is not the expected {sha256} (a partial download or another object)")
    ctl = Etcdctl([])
    try:
        ctl.snapshot_status(str(snapshot_file))
        ctl.snapshot_restore(
            str(snapshot_file), name=member,
            initial_cluster=",".join(f"{m.name}=https://{m.ip}:2380" for m in members),
            cluster_token=etcd_cluster_token(cluster, events), peer_url=f"https://{this.ip}:2380",
            data_dir=str(data_dir),
        )
    except EtcdError as error:
        fail(str(error))
    out.print(f"restored {snapshot_file} for {member} into {data_dir}", markup=False)


def _await_machine(what_to_do: str, timeout: int):
    """The `start_member` step of a membership change: the operator's (or Pulumi's) part."""
    def start_member(member_name: str, initial_cluster: str) -> None:
        out.print(f"{member_name} is added. {what_to_do} (docs/etcd.md); on an empty data dir its join-state "
                  f"check starts etcd with initial-cluster-state existing and\n  initial-cluster: {initial_cluster}\n"
                  f"Waiting up to {timeout} s for it to join...", markup=False)
    return start_member


@app.command(epilog=examples(
    "corral etcd replace jaguar jaguar-etcd-1",
))
def replace(name: ClusterArg, member: Annotated[str, typer.Argument(help="Member to replace (e.g. jaguar-etcd-1).")],
            clusters: ClustersOption = DEFAULT_CLUSTERS, events: EventsOption = False,
            endpoints: EndpointsOption = None, cacert: CaOption = None, cert: CertOption = None,
            key: KeyOption = None,
            timeout: Annotated[int, typer.Option(help="Seconds to wait for the new member.")] = 1800) -> None:
    """Replace one member whose machine or disk is replaced: health gate, leadership moved away,
    `member remove`, `member add` (same name and address), then wait until the new machine's etcd
    has joined and caught up. One member at a time; the others must be healthy."""
    from corral.etcd import EtcdError, replace_member

    cluster = cluster_or_exit(clusters, name)
    this = next((m for m in _members(cluster, events) if m.name == member), None)
    if this is None:
        fail(f"{member} is not a member of {name}'s etcd")
    ctl = _ctl(cluster, events, endpoints, cacert, cert, key)

    start_member = _await_machine("Now replace its machine (or disk), e.g. `pulumi up --replace <urn>`", timeout)
    try:
        change = replace_member(ctl, member, f"https://{this.ip}:2380", start_member, timeout)
    except EtcdError as error:
        fail(str(error))
    steps = ", ".join(f"{step} {seconds:.1f} s" for step, seconds in change.steps)
    out.print(f"{member} replaced in {change.seconds:.0f} s ({steps})", markup=False)


@app.command(epilog=examples(
    "corral etcd add jaguar jaguar-etcd-3",
))
def add(name: ClusterArg, member: Annotated[str, typer.Argument(help="Member to add (e.g. jaguar-etcd-3).")],
        peer_url: Annotated[Optional[str], typer.Option(
            help="The new member's peer URL; default: its address in the cluster's layout.")] = None,
        clusters: ClustersOption = DEFAULT_CLUSTERS, events: EventsOption = False,
        endpoints: EndpointsOption = None, cacert: CaOption = None, cert: CertOption = None,
        key: KeyOption = None,
        timeout: Annotated[int, typer.Option(help="Seconds to wait for the new member.")] = 1800) -> None:
    """Grow by ONE member: health gate, `member add`, then wait until the new machine's etcd has joined
    and caught up. Raise controlPlane.etcd.members in the cluster file first; add members one at a time."""
    from corral.etcd import EtcdError, add_member

    cluster = cluster_or_exit(clusters, name)
    layout_members = _members(cluster, events)
    this = next((m for m in layout_members if m.name == member), None)
    if this is None and not peer_url:
        fail(f"{member} is not in {name}'s layout ({', '.join(m.name for m in layout_members)}): raise "
             "controlPlane.etcd.members in the cluster file first (or give --peer-url)")
    ctl = _ctl(cluster, events, endpoints, cacert, cert, key)
    try:
        current = len(ctl.members())
    except EtcdError as error:
        fail(str(error))
    if current >= len(layout_members):
        fail(f"{name}'s etcd already has {current} members and the cluster file says {len(layout_members)}: "
             "raise controlPlane.etcd.members first")

    start_member = _await_machine("Create its machine if it is not there yet (`pulumi up` with the new member "
                                  "count)", timeout)
    try:
        change = add_member(ctl, member, peer_url or f"https://{this.ip}:2380", start_member, timeout)
    except EtcdError as error:
        fail(str(error))
    _report(change, current + 1, len(layout_members))


@app.command(epilog=examples(
    "corral etcd remove jaguar jaguar-etcd-4",
))
def remove(name: ClusterArg, member: Annotated[str, typer.Argument(help="Member to remove (e.g. jaguar-etcd-4).")],
           clusters: ClustersOption = DEFAULT_CLUSTERS, events: EventsOption = False,
           endpoints: EndpointsOption = None, cacert: CaOption = None, cert: CertOption = None,
           key: KeyOption = None,
           timeout: Annotated[int, typer.Option(help="Seconds to wait for the smaller cluster's health.")] = 300,
           ) -> None:
    """Shrink by ONE member: every other member must be healthy (so the quorum holds), never below 3;
    its leadership is handed over first, then `member remove`. Lower controlPlane.etcd.members first;
    delete the machine (`pulumi up`) after."""
    from corral.etcd import EtcdError, remove_member

    cluster = cluster_or_exit(clusters, name)
    layout_members = _members(cluster, events)
    if any(m.name == member for m in layout_members):
        fail(f"{member} is in {name}'s layout (controlPlane.etcd.members: {len(layout_members)}): lower it in the "
             f"cluster file first; to replace a member's machine or disk use `corral etcd replace`")
    ctl = _ctl(cluster, events, endpoints, cacert, cert, key)
    try:
        before = len(ctl.members())
        change = remove_member(ctl, member, timeout)
    except EtcdError as error:
        fail(str(error))
    _report(change, before - 1, len(layout_members))
    out.print(f"Now delete {member}'s machine (`pulumi up`); its etcd has left the cluster.", markup=False)


def _report(change, members: int, target: int) -> None:
    steps = ", ".join(f"{step} {seconds:.1f} s" for step, seconds in change.steps)
    out.print(f"{change.member}: {change.action} done in {change.seconds:.0f} s ({steps}); {members} members, "
              f"healthy", markup=False)
    if members != target:
        out.print(f"The cluster file says {target}: {change.action} the next member the same way"
                  + (" (an even count tolerates no more failures than one member fewer)." if members % 2 == 0
                     else "."), markup=False)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="etcd")
