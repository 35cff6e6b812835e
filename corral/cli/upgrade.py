"""`corral upgrade`: control plane, then cloud pools, then on-prem nodes in batches."""

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
    check_ssh_user_option,
    cluster_or_exit,
    err,
    etcdctl_or_exit,
    examples,
    fail,
    out,
)


def _print_chain(cluster, name: str, start: str | None, target: str | None, etcd_version: str | None) -> None:
    """`--plan`: the upgrade chain, offline (corral/upgrade/chain.py)."""
    from datetime import date

    from corral.model.versions import ETCD_MEMBER
    from corral.upgrade.chain import describe_chain, upgrade_chain
    from corral.upgrade.versions import UpgradeError

    if start is None and target is None:
        fail(f"--plan needs --from VERSION (the Kubernetes {name} runs; it goes to the file's "
             f"{cluster.kubernetes.version}) or --to VERSION (where it goes from the file's)")
    start = start or cluster.kubernetes.version
    try:
        steps = upgrade_chain(cluster, start, target, etcd_version or ETCD_MEMBER.value)
    except UpgradeError as error:
        fail(str(error))
    for line in describe_chain(name, start, steps, date.today()):
        out.print(line, markup=False)
    if any(step.blockers for step in steps):
        raise typer.Exit(1)


def _plan_table(plan) -> Table:
    table = Table(title=escape(f"upgrade {plan.cluster} to {plan.target} (API servers at {plan.api_server})"))
    for column in ("#", "phase", "what", "action"):
        table.add_column(column)
    for number, step in enumerate(plan.steps, 1):
        table.add_row(str(number), step.phase, escape(step.what), escape(step.action))
    return table


def upgrade(
    name: ClusterArg,
    clusters: ClustersOption = DEFAULT_CLUSTERS,
    to: Annotated[Optional[str], typer.Option(
        "--to", help="Target Kubernetes version (default: the cluster file's kubernetes.version).")] = None,
    check: Annotated[bool, typer.Option("--check", help="Print the order of the upgrade; change nothing.")] = False,
    plan: Annotated[bool, typer.Option(
        "--plan", help="Print the chain of upgrades from --from to --to (one minor at a time) and what changes at "
                       "each step, from the cluster file and the version catalog alone; change nothing.")] = False,
    from_: Annotated[Optional[str], typer.Option(
        "--from", help="--plan: the Kubernetes version the cluster runs (default: the cluster file's).")] = None,
    etcd_version: Annotated[Optional[str], typer.Option(
        "--etcd-version", help="--plan: the etcd version the members run (default: corral's pin).")] = None,
    batch: Annotated[str, typer.Option(help="On-prem nodes upgraded at once: a count (5) or a percentage (10%).")] = "10%",
    max_fail_percentage: Annotated[int, typer.Option(
        help="Stop before the next batch when more than this percentage of a batch failed.", min=0, max=100)] = 0,
    pool: Annotated[Optional[str], typer.Option(help="Only this on-prem pool.")] = None,
    limit: Annotated[Optional[list[str]], typer.Option("--limit", help="Only these on-prem hosts (repeatable).")] = None,
    kubeconfig: Annotated[Optional[Path], typer.Option(
        help="Operator credential: reads versions, sets up the node runner's identity and issues its token. "
             "Default: $KUBECONFIG, else the stack's adminKubeconfig.", dir_okay=False)] = None,
    token_ttl: Annotated[str, typer.Option(
        help="Lifetime of the node runner's token (5m..24h); revoked when the run ends.")] = "4h",
    forks: Annotated[int, typer.Option(help="Hosts worked on in parallel (within a batch).", min=1)] = 50,
    runs_dir: Annotated[Optional[Path], typer.Option(help="Where ansible-runner keeps artifacts.")] = None,
    extra_vars: Annotated[Optional[list[Path]], typer.Option(
        "--extra-vars", "-e", help="Variables file of site overrides (repeatable), e.g. repository URLs.",
        exists=True, dir_okay=False)] = None,
    state_file: Annotated[Optional[Path], typer.Option(
        help="The control plane's progress (resumes from it). Default: "
             "~/.local/state/corral/upgrades/CLUSTER.json.", dir_okay=False)] = None,
    etcd_endpoints: Annotated[Optional[list[str]], typer.Option(
        "--etcd-endpoint", help="etcd client URL for the health gate (repeatable). Default: the layout's members.")] = None,
    etcd_cacert: Annotated[Optional[Path], typer.Option(help="etcd CA certificate (health gate).")] = None,
    etcd_cert: Annotated[Optional[Path], typer.Option(help="etcd client certificate (health gate).")] = None,
    etcd_key: Annotated[Optional[Path], typer.Option(help="etcd client key (health gate).")] = None,
    gate_timeout: Annotated[float, typer.Option(help="Seconds a health gate may take to pass.", min=1)] = 900,
    cloud_gpu_batch: Annotated[int, typer.Option(
        help="Cloud GPU nodes of a pool drained and replaced at once.", min=1)] = 1,
    replacement_timeout: Annotated[float, typer.Option(
        help="Seconds a cloud GPU batch's replacements may take to turn Ready.", min=1)] = 1800,
    outputs: Annotated[Optional[Path], typer.Option(
        "--outputs", help="The stack outputs as a JSON file (as `corral join --outputs`): cloud GPU nodes' "
                          "instances are verified against its nodeGroups before they are replaced. Default: "
                          "`pulumi stack output nodeGroups`.", dir_okay=False)] = None,
    renew_certs: Annotated[bool, typer.Option(
        "--renew-certs", help="Instead of an upgrade: renew the API servers' kubeadm certificates by replacing, "
                              "one at a time behind the gates, the machines whose certificate is due.")] = False,
    renew_days: Annotated[int, typer.Option(
        help="--renew-certs: renew certificates with fewer days left.", min=1)] = 30,
    force_renew: Annotated[bool, typer.Option(
        "--force-renew", help="--renew-certs: replace every API server, due or not.")] = False,
    etcd_members: Annotated[bool, typer.Option(
        "--etcd-members", help="--renew-certs: the etcd members instead: each whose presented certificate is "
                               "due fetches the one `pulumi up` re-issued and restarts etcd, one at a time behind "
                               "the health gates, over ssh.")] = False,
    ssh: Annotated[str, typer.Option(
        envvar="CORRAL_ETCD_SSH", help="--etcd-members: the ssh command and its options (e.g. 'ssh -J bastion').")
    ] = "ssh",
    ssh_user: Annotated[str, typer.Option(
        envvar="CORRAL_ETCD_SSH_USER", callback=check_ssh_user_option, help="--etcd-members: ssh user; other than root, commands run "
                                            "through sudo -n.")] = "root",
    cert_endpoints: Annotated[Optional[list[str]], typer.Option(
        "--cert-endpoint", help="--renew-certs: read MACHINE's certificate at HOST:PORT instead of its "
                                "address:6443 (repeatable), e.g. through a tunnel.", metavar="MACHINE=HOST:PORT")] = None,
) -> None:
    """Upgrade the cluster to its declared Kubernetes version (and the pools' drivers); exit 1 if any host failed.

    Control plane first (one API server at a time), then cloud pools, then
    on-prem nodes in batches: cordon, drain (PodDisruptionBudgets respected),
    packages and `kubeadm upgrade node`, NVIDIA driver where it changed,
    restart, wait Ready, uncordon. Re-running resumes: nodes already at the
    target and not left cordoned are skipped.
    """
    from corral.nodes.join import ClusterAccess, JoinError, parse_ttl, select_hosts
    from corral.upgrade.plan import build_plan, parse_batch, read_cluster_state
    from corral.upgrade.versions import KubeVersion, UpgradeError

    from .nodes import _progress_table

    cluster = cluster_or_exit(clusters, name)
    if plan:
        _print_chain(cluster, name, from_, to, etcd_version)
        return
    if renew_certs and etcd_members:
        _renew_etcd_certs(cluster, name, check, renew_days, force_renew, cert_endpoints or [], etcd_endpoints,
                          (etcd_cacert, etcd_cert, etcd_key), gate_timeout, ssh, ssh_user)
        return
    if renew_certs:
        _renew_certs(cluster, name, kubeconfig, check, renew_days, force_renew, cert_endpoints or [], state_file,
                     etcd_endpoints, (etcd_cacert, etcd_cert, etcd_key), gate_timeout)
        return
    try:
        target = KubeVersion.parse(to or cluster.kubernetes.version, "--to" if to else "kubernetes.version")
        batch = parse_batch(batch)
        ttl = parse_ttl(token_ttl)
        hosts = select_hosts(cluster, pool, limit or []) if cluster.onprem_pools else []
        access = ClusterAccess.resolve(name, kubeconfig, from_stack=True)
        state = read_cluster_state(access)
        plan = build_plan(cluster, target, state, batch, hosts)
    except (JoinError, UpgradeError) as error:
        fail(str(error))
    out.print(_plan_table(plan))
    if plan.onprem_not_nodes:
        out.print(f"not cluster nodes yet (left to `corral join`): {', '.join(plan.onprem_not_nodes)}", markup=False)
    if hosts:
        out.print("GPU hosts whose installed driver differs from their pool's are drained and upgraded in the "
                  "same batches (decided on the hosts).", markup=False)
    gpu_pools = any(pool.gpu for pool in cluster.cloud_pools)
    if gpu_pools and state.api_server >= target:
        # (before the control plane has moved, replacements would boot a kubelet newer than it)
        _roll_cloud_gpu(cluster, access, target, cloud_gpu_batch, max_fail_percentage, replacement_timeout,
                        outputs, check=True)
    if check:
        return
    if any(step.phase == "control-plane" for step in plan.steps):
        _roll_control_plane(cluster, target, access, state_file, etcd_endpoints,
                            _etcd_tls((etcd_cacert, etcd_cert, etcd_key)), gate_timeout)
        try:
            state = read_cluster_state(access)
            plan = build_plan(cluster, target, state, batch, hosts)
        except UpgradeError as error:
            fail(f"after the control plane: {error}")
        if state.api_server < target:
            fail(f"the control plane was rolled, but the API server still reports {state.api_server}: "
                 "no node is upgraded before it runs the target")
    if gpu_pools:
        _roll_cloud_gpu(cluster, access, target, cloud_gpu_batch, max_fail_percentage, replacement_timeout,
                        outputs, check=False)
    if not hosts:
        out.print("no on-prem hosts: nothing more to do here (CPU cloud pools roll through `corral up`)",
                  markup=False)
        return
    _run_onprem(cluster, str(target), hosts, access, ttl, batch, max_fail_percentage, forks, runs_dir,
                extra_vars or [], _progress_table)


def _roll_cloud_gpu(cluster, access, target, batch, max_fail_percentage, wait_timeout, outputs, check) -> None:
    """The cloud GPU pools' drained replacement (corral/upgrade/cloudgpu.py); `check`: print the batches."""
    from corral.health.instances import read_node_groups
    from corral.health.kube import HealthError, Kubectl
    from corral.upgrade.cloudgpu import (
        check_steps, cloud_gpu_nodes, kubeconfig_path, plan_batches, pool_templates, provider_id_claims,
        roll_cloud_gpu_pools,
    )
    from corral.upgrade.versions import UpgradeError

    with kubeconfig_path(access) as kubeconfig:
        try:
            kubectl = Kubectl(kubeconfig)
            items = kubectl.nodes()
            nodes = cloud_gpu_nodes(cluster, items)
            todo = plan_batches(nodes, target, batch, pool_templates(cluster))
            try:
                node_groups = read_node_groups(cluster.name, outputs) if todo else {}
            except HealthError as error:
                if not check:
                    raise HealthError(f"instances are replaced only once verified against the stack output "
                                      f"nodeGroups: {error}") from None
                node_groups = error
            if check:
                lines = check_steps(cluster, nodes, target, batch, node_groups, provider_id_claims(items))
                out.print("\n".join(["cloud GPU pools (drained replacement):", *lines]) if lines
                          else f"cloud GPU pools: every node runs {target} on its pool's current template",
                          markup=False)
                return
            report = roll_cloud_gpu_pools(cluster, kubectl, target, batch, max_fail_percentage, node_groups,
                                          wait_timeout,
                                          on_step=lambda what, step: err.print(f"{what}: {step}", markup=False))
        except (HealthError, UpgradeError) as error:
            fail(f"cloud GPU pools: {error}")
    for name, why in report.failed.items():
        err.print(f"{name}: {why}", markup=False)
    out.print(f"cloud GPU pools: {len(report.replaced)} node(s) replaced, {len(report.failed)} failed", markup=False)
    if report.stopped or report.failed:
        fail(f"cloud GPU pools: {report.stopped or 'some nodes failed'} (run corral upgrade again to resume)")


def _etcd_tls(tls):
    if any(tls) and not all(tls):
        fail("--etcd-cacert, --etcd-cert and --etcd-key go together")
    return tls if all(tls) else None


def _state_file(cluster, state_file, kind: str) -> Path:
    import os

    base = Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state"))
    return state_file or base / "corral" / kind / f"{cluster.name}.json"


def _roll_control_plane(cluster, target, access, state_file, etcd_endpoints, tls, gate_timeout,
                        only=None, what="replaced") -> int:
    from corral.etcd import Tls, require_healthy
    from corral.model.layout import layout
    from corral.upgrade.controlplane import kubectl_gates, machine_urns, replace_machine, roll_control_plane
    from corral.upgrade.versions import UpgradeError

    state_file = _state_file(cluster, state_file, "upgrades")
    endpoints = etcd_endpoints or layout(cluster).etcd_client_urls()
    ctl = etcdctl_or_exit(endpoints, Tls(*map(str, tls)) if tls else None)
    gates = kubectl_gates(access, lambda: require_healthy(ctl, action="replace an API server"), timeout=gate_timeout)
    machines = [m.name for m in layout(cluster).api_servers if only is None or m.name in only]
    try:
        urns = machine_urns(cluster.name, cluster.control_plane.cloud, machines)
        roll_control_plane(cluster, target, gates, state_file, lambda urn: replace_machine(cluster.name, urn), urns,
                           on_step=lambda machine, step: err.print(f"{machine}: {step}", markup=False), only=only)
    except UpgradeError as error:
        fail(f"{error} (progress kept in {state_file}: run again to resume)")
    out.print(f"control plane at {target}: {len(urns)} API servers {what} and healthy", markup=False)
    return len(urns)


def _show_renewal(title, certs, due, now, action, count_what, check) -> bool:
    """Print what a renewal does per machine; True when nothing is left to do (--check, or none due)."""
    table = Table(title=escape(title))
    for column in ("machine", "presented at", "expires (UTC)", "days left", "action"):
        table.add_column(column)
    for cert in certs:
        expires = cert.record.not_after.strftime("%Y-%m-%d %H:%M") if cert.record else "not read"
        left = f"{cert.record.days_left(now):.1f}" if cert.record else "-"
        table.add_row(escape(cert.machine), escape(cert.endpoint), expires, left,
                      action if cert.machine in due else "keep")
    out.print(table)
    if check or not due:
        out.print(f"{len(due)} {count_what}" + (" (--check: nothing changed)" if check else ""), markup=False)
        return True
    return False


def _renew_etcd_certs(cluster, name, check, days, force, cert_endpoints, etcd_endpoints, tls, gate_timeout,
                      ssh, ssh_user) -> None:
    """`--renew-certs --etcd-members`: restart, one at a time, the members whose certificate is due
    (corral/certs/etcd_roll.py)."""
    import shlex

    from corral.certs.etcd_roll import RESTART, roll_etcd_members
    from corral.certs.expiry import now_utc
    from corral.certs.renew import ETCD_CLIENT_PORT, RenewError, choose, parse_endpoint_overrides, read_presented
    from corral.etcd import EtcdError, Tls
    from corral.etcd.restore import Remote, RestoreMember, Ssh
    from corral.model.layout import layout

    tls = _etcd_tls(tls)
    members = {m.name: m.ip for m in layout(cluster).etcd_members}
    try:
        overrides = parse_endpoint_overrides(cert_endpoints, list(members))
        certs = read_presented(members, overrides, port=ETCD_CLIENT_PORT)
        now = now_utc()
        due = choose(certs, now, days, force)
    except RenewError as error:
        fail(str(error))
    if _show_renewal(f"etcd member certificates of {name} (renew under {days} days)", certs, due, now,
                     "fetch the re-issued certificate, restart etcd", "etcd member(s) to restart", check):
        return
    if tls is None:
        fail("--etcd-members needs the etcd client certificate for the health gates: --etcd-cacert, --etcd-cert "
             "and --etcd-key")
    ctl = etcdctl_or_exit(etcd_endpoints or layout(cluster).etcd_client_urls(), Tls(*map(str, tls)))
    login = Ssh(tuple(shlex.split(ssh)), ssh_user)

    def restart(member: str) -> None:
        Remote(RestoreMember(member, members[member]), login).sh(RESTART, timeout=gate_timeout)

    def still_due(member: str) -> str:
        cert = read_presented({member: members[member]}, overrides, port=ETCD_CLIENT_PORT)[0]
        if cert.record is None:
            return f"presents no certificate at {cert.endpoint} ({cert.problem})"
        if cert.due(now_utc(), days):
            return f"still presents a certificate expiring {cert.record.not_after:%Y-%m-%d %H:%M} UTC"
        return ""

    try:
        done = roll_etcd_members(ctl, [m for m in members if m in due], restart, still_due, gate_timeout,
                                 on_step=lambda member, step: err.print(f"{member}: {step}", markup=False))
    except EtcdError as error:
        fail(f"{error} (run again: members already renewed are not restarted twice)")
    out.print(f"{len(done)} etcd member(s) restarted with their renewed certificate", markup=False)


def _renew_certs(cluster, name, kubeconfig, check, days, force, cert_endpoints, state_file, etcd_endpoints,
                 tls, gate_timeout) -> None:
    """`--renew-certs`: replace the API servers whose certificate is due (corral/certs/renew.py)."""
    from corral.certs.expiry import now_utc
    from corral.certs.renew import RenewError, choose, parse_endpoint_overrides, read_presented, unfinished
    from corral.model.layout import layout
    from corral.nodes.join import ClusterAccess, JoinError
    from corral.upgrade.plan import read_cluster_state
    from corral.upgrade.versions import KubeVersion, UpgradeError

    tls = _etcd_tls(tls)
    state_file = _state_file(cluster, state_file, "cert-renewals")
    machines = {m.name: m.ip for m in layout(cluster).api_servers}
    try:
        overrides = parse_endpoint_overrides(cert_endpoints, list(machines))
        access = ClusterAccess.resolve(name, kubeconfig, from_stack=True)
        running = read_cluster_state(access).api_server
        declared = KubeVersion.parse(cluster.kubernetes.version, "kubernetes.version")
        if running != declared:
            raise RenewError(f"the API servers run {running}, the cluster file declares {declared}: a replaced "
                             "machine would boot the declared version; finish (or revert) that upgrade first "
                             "(corral upgrade), then renew")
        certs = read_presented(machines, overrides)
        now = now_utc()
        due = choose(certs, now, days, force, resume=unfinished(state_file))
    except (JoinError, UpgradeError, RenewError) as error:
        fail(str(error))
    if _show_renewal(f"API server certificates of {name} (renew under {days} days)", certs, due, now,
                     "replace (new kubeadm certificates)", "API server(s) to renew", check):
        return
    renewed = _roll_control_plane(cluster, running, access, state_file, etcd_endpoints, tls, gate_timeout,
                                  only=due, what="renewed")
    # The machines replaced must present a certificate that is not due any more.
    after = {c.machine: c for c in read_presented({m: machines[m] for m in due}, overrides)}
    still = [m for m in due if after[m].record is None or after[m].due(now_utc(), days)]
    if still:
        fail(f"replaced, but still presenting a certificate due within {days} days (or none): "
             + ", ".join(f"{m} ({after[m].endpoint})" for m in still)
             + f"; progress in {state_file}")
    state_file.unlink(missing_ok=True)  # done: the next renewal, a year on, starts afresh
    out.print(f"{renewed} API server certificate set(s) renewed", markup=False)


def _run_onprem(cluster, target, hosts, access, ttl, batch, max_fail_percentage, forks, runs_dir, extra_vars,
                progress_table) -> None:
    from rich.live import Live

    from corral.nodes.join import JoinError
    from corral.upgrade.credential import runner_kubeconfig
    from corral.upgrade.onprem import run_onprem_upgrade
    from corral.upgrade.versions import UpgradeError

    title = f"upgrade {cluster.name} to {target}: {len(hosts)} on-prem host{'s' * (len(hosts) != 1)}"
    latest = {}
    try:
        with runner_kubeconfig(access, ttl, on_warning=lambda m: err.print(f"warning: {m}", markup=False)) as cred:
            with Live(console=err, refresh_per_second=4, transient=True,
                      get_renderable=lambda: progress_table(latest["r"], title) if "r" in latest
                      else Table(title=escape(title))):
                report = run_onprem_upgrade(
                    cluster, target, hosts, cred.kubeconfig, batch, max_fail_percentage, secret=cred.token,
                    runs_dir=runs_dir, forks=forks, extra_vars=extra_vars,
                    on_update=lambda r: latest.setdefault("r", r))
    except (JoinError, UpgradeError) as error:
        fail(str(error))
    out.print(progress_table(report, title, final=True))
    bad = [r for r in report.hosts.values() if r.status not in ("ok", "changed")]
    out.print(f"{len(hosts) - len(bad)} of {len(hosts)} hosts ok; artifacts: {report.artifacts}", markup=False)
    # The playbook's recap cannot say which hosts a stopped run never reached
    # (their first play went fine): ask the API server what is still behind.
    behind = _still_behind(access, target, hosts)
    if behind:
        out.print(f"{len(behind)} node(s) not at {target} or still cordoned by corral (run corral upgrade "
                  f"again to resume): {', '.join(behind)}", markup=False)
    if not report.succeeded or behind:
        raise typer.Exit(1)


def _still_behind(access, target: str, hosts: list[str]) -> list[str]:
    from corral.upgrade.plan import node_for_host, read_cluster_state
    from corral.upgrade.versions import KubeVersion, UpgradeError

    try:
        state = read_cluster_state(access)
    except UpgradeError as error:
        err.print(f"warning: could not re-read the nodes after the run: {error}", markup=False)
        return []
    wanted = KubeVersion.parse(target)
    behind = []
    for host in sorted(hosts):
        node = node_for_host(host, state.nodes)
        if node is not None and (node.kubelet != wanted or node.cordoned_by_corral):
            behind.append(host)
    return behind


def register(app: typer.Typer) -> None:
    app.command(epilog=examples(
        "corral upgrade jaguar --to 1.32.0 --check",
        "corral upgrade jaguar --to 1.32.0 --pool gpu-h100-sf1 --batch 5",
    ))(upgrade)
