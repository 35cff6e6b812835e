"""Wall time of `corral join` on 1, 8 and 32 throwaway hosts, of a no-change re-run, and of a ping.

Needs root and the test-host lab (tests/hostlab: systemd-nspawn, debootstrap).
Each case boots fresh GPU hosts, joins them through the real CLI against the
lab's signed apt repository of test fakes, and times the CLI end to end
(interpreter start, ansible-runner, every role), and splits the CPU it used
between the controller (this process's children), the test hosts (the
lab's cgroup) and everything else the machine did meanwhile ("other": it
should be ~0; run it on an otherwise idle machine). Targets (issue 16): with
`--host-cpus`, 8 hosts' first join under 1.5x one host's; a no-change re-run
within 3x an `ansible -m ping` of the same hosts.

The test hosts are containers on this machine's cores, while hosts in a data
centre each have their own: unlimited, N hosts' package and module work
queues for the same cores (on 2 cores, 8 CPU-bound hosts cannot take less
than 4x one host, whatever the playbook does). `--host-cpus C` gives every
host a fixed C cores (cgroup quota), alone or among N, which is the data
centre's situation scaled down; then the ratio measures the join itself: its
serial steps (batches, the controller).

The `image` row: a host booted from a node image (node-images/image.yml baked
on a builder host, its disk copied to a new host) and joined; its first join
against the bare host's of size 1.

Per size: the first join; a no-change re-run (every host's converge record
is up to date: one shell command per host, no role runs); a `--force` re-run
(every role on every host, all tasks ok); and `ansible -m ping` of the same
hosts through the same ssh settings, the floor a no-change run is measured
against (issue 16: within 3x).

    python benchmarks/bench_join.py [--sizes 1,8,32] [--host-cpus 0.2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.hostlab.aptrepo import AptRepo  # noqa: E402
from tests.hostlab.lab import Lab, LabConfig, available  # noqa: E402
from tests.nodes import joinlab  # noqa: E402


@dataclass
class Timing:
    """One `corral join` (or ping): wall time and where the CPU went.

    The test hosts are containers on this machine's cores, so their CPU and
    the controller's (corral, ansible-runner, ansible-playbook and its forks,
    ssh) come out of the same budget. `hosts_cpu` is read from the lab's own
    cgroup, so it is the test hosts' alone; `other_cpu` is everything else
    the machine did meanwhile (other work on a shared machine): a large value
    says the wall times are not to be trusted. `floor` is the wall time that
    the join's own CPU needs on this machine: when wall is close to it, the
    run is CPU-bound here rather than waiting on serial steps.
    """

    wall: float
    controller_cpu: float
    hosts_cpu: float
    other_cpu: float

    @property
    def floor(self) -> float:
        return (self.controller_cpu + self.hosts_cpu) / (os.cpu_count() or 1)


def _machine_busy_seconds() -> float:
    """CPU seconds spent by the whole machine (every process), from /proc/stat."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _lab_cpu_seconds(bridge: str) -> float:
    """CPU seconds used by every test host of the lab, from the lab's cgroup.

    The lab puts each host in `corral-hostlab-<bridge>/<machine>` in the
    cgroup v2 hierarchy (mounted at /sys/fs/cgroup, or /sys/fs/cgroup/unified
    next to v1 controllers), whose cpu.stat counts the hosts that were
    removed too; a v1 cpuacct group is used where there is one.
    """
    group = f"corral-hostlab-{bridge}"
    v1 = Path("/sys/fs/cgroup/cpuacct") / group / "cpuacct.usage"
    if v1.exists():
        return int(v1.read_text()) / 1e9
    for root in (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup")):
        stat = root / group / "cpu.stat"
        if stat.exists():
            for line in stat.read_text().splitlines():
                if line.startswith("usage_usec "):
                    return int(line.split()[1]) / 1e6
    raise RuntimeError(f"no CPU accounting found for the lab's cgroup {group}")


class Meter:
    """CPU of the controller (this process's children), the test hosts and the rest, over a block."""

    def __init__(self, bridge: str):
        self.bridge = bridge

    def __enter__(self) -> "Meter":
        self._children = resource.getrusage(resource.RUSAGE_CHILDREN)
        self._busy, self._lab = _machine_busy_seconds(), _lab_cpu_seconds(self.bridge)
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        wall = time.perf_counter() - self._start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        controller = (after.ru_utime - self._children.ru_utime) + (after.ru_stime - self._children.ru_stime)
        hosts = _lab_cpu_seconds(self.bridge) - self._lab
        other = max(0.0, _machine_busy_seconds() - self._busy - controller - hosts)
        self.timing = Timing(wall, controller, hosts, other)


def timed_join(setup, bridge: str, *extra: str) -> tuple[Timing, subprocess.CompletedProcess]:
    with Meter(bridge) as meter:
        result = subprocess.run(joinlab.corral_join_argv(setup, *extra), env=joinlab.env_with(setup),
                                capture_output=True, text=True, timeout=3600)
    return meter.timing, result


def timed_ping(setup, hosts, bridge: str) -> Timing:
    """`ansible -m ping` of the same hosts, through the join's own inventory (addresses,
    ssh settings, host keys checked): the floor."""
    from corral.model import load_cluster
    from corral.nodes import inventory as inv

    source = setup.runs_dir.parent / "ping-inventory.json"
    cluster = load_cluster(setup.clusters / f"{joinlab.CLUSTER}.yaml")
    source.write_text(json.dumps(inv.to_ansible_json(inv.as_yaml_inventory(inv.build(cluster)))))
    argv = [str(Path(sys.executable).with_name("ansible")), "-i", str(source), ",".join(h.name for h in hosts),
            "-m", "ansible.builtin.ping", "--forks", "50"]
    env = joinlab.env_with(setup) | {"ANSIBLE_CONFIG": str(ROOT / "ansible" / "ansible.cfg")}
    with Meter(bridge) as meter:
        result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        sys.exit(f"ansible ping failed:\n{result.stdout}{result.stderr}")
    return meter.timing


def image_row(lab, repo, bridge: str) -> dict[str, Timing]:
    """One host from a node image: bake image.yml on a builder, boot a copy of its disk, join it.

    The join after an image changes only what no image can carry (the join,
    the cluster's and the pool's settings): its wall time against the size-1
    row's first join is what an image saves (tests/nodes/test_image_then_join.py
    checks which tasks change).
    """
    builder = lab.boot(["bimg-build-001.sf1.internal"])[0]
    hosts = [builder]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            with Meter(bridge) as bake:
                image = joinlab.bake_image(lab, repo, builder, Path(tmp))
            if image["rc"] != 0:
                sys.exit(f"image.yml failed:\n{image['stdout'][-5000:]}{image['stderr'][-2000:]}")
            builder.stop()
            node = lab.boot_from(builder, "bimg-gpu-001.sf1.internal")
            hosts.append(node)
            setup = joinlab.prepare(lab, repo, [node], Path(tmp), [node.name], [])
            join, result = timed_join(setup, bridge)
            if result.returncode != 0:
                sys.exit(f"join after the image failed:\n{result.stdout}{result.stderr}")
            return {"bake": bake.timing, "join": join}
    finally:
        joinlab.remove_hosts(lab, hosts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,8")
    parser.add_argument("--image", action=argparse.BooleanOptionalAction, default=True,
                        help="also time a join of a host booted from a node image (the `image` row)")
    parser.add_argument(
        "--host-cpus", type=float, default=None, metavar="CORES",
        help="give every test host this much CPU (cgroup quota), alone or not, as "
             "data-centre hosts each have their own; largest size x CORES must stay "
             "below this machine's cores with room for the controller")
    args = parser.parse_args()
    sizes = [int(n) for n in args.sizes.split(",")]
    if args.host_cpus and max(sizes) * args.host_cpus > (os.cpu_count() or 1) - 0.3:
        sys.exit(f"{max(sizes)} hosts x {args.host_cpus} cores leave the controller less than "
                 f"0.3 of this machine's {os.cpu_count()} cores: lower --host-cpus")
    ok, reason = available()
    if not ok:
        sys.exit(f"the test-host lab is not available here: {reason}")
    rows = []
    config = LabConfig(bridge="corralbench0", subnet="10.79.0.0/24", machine_prefix="bench-",
                       host_cpus=args.host_cpus)
    with Lab(config) as lab:
        repo = AptRepo(lab).build().serve()
        try:
            for size in sizes:
                gpu, _ = joinlab.host_names(gpu=size, cpu=0, prefix=f"b{size}")
                hosts = lab.boot(gpu)
                try:
                    with tempfile.TemporaryDirectory() as tmp:
                        setup = joinlab.prepare(lab, repo, hosts, Path(tmp), gpu, [])
                        first, result = timed_join(setup, config.bridge)
                        if result.returncode != 0:
                            sys.exit(f"join of {size} hosts failed:\n{result.stdout}{result.stderr}")
                        again, result = timed_join(setup, config.bridge)
                        if result.returncode != 0:
                            sys.exit(f"re-run on {size} hosts failed:\n{result.stdout}{result.stderr}")
                        if f"{size} up to date (not run)" not in result.stdout:
                            sys.exit(f"the no-change re-run on {size} hosts ran roles:\n{result.stdout}")
                        forced, result = timed_join(setup, config.bridge, "--force")
                        if result.returncode != 0:
                            sys.exit(f"forced re-run on {size} hosts failed:\n{result.stdout}{result.stderr}")
                        ping = timed_ping(setup, hosts, config.bridge)
                        rows.append((size, {"join": first, "re-run": again, "forced": forced, "ping": ping}))
                finally:
                    joinlab.remove_hosts(lab, hosts)
            image = image_row(lab, repo, config.bridge) if args.image else None
        finally:
            repo.stop()
    limit = f"{args.host_cpus} cores each (cgroup quota)" if args.host_cpus else "sharing all cores"
    print(f"test hosts: {limit}; machine: {os.cpu_count()} cores")
    print("wall s | controller CPU s (per host) | test hosts' CPU s (per host) | CPU floor s (join CPU / cores) "
          "| other CPU s (the rest of the machine meanwhile: should be ~0)")
    print(f"{'hosts':>5} {'run':>9} {'wall':>7} {'ctl cpu':>8} {'ctl/host':>9} {'host cpu':>9} {'host/host':>9} "
          f"{'floor':>7} {'other':>7}")
    for size, runs in rows:
        for label, t in runs.items():
            print(f"{size:>5} {label:>9} {t.wall:>7.1f} {t.controller_cpu:>8.1f} {t.controller_cpu / size:>9.2f} "
                  f"{t.hosts_cpu:>9.1f} {t.hosts_cpu / size:>9.2f} {t.floor:>7.1f} {t.other_cpu:>7.1f}")
        print(f"{size:>5} no-change re-run / ansible ping: {runs['re-run'].wall / runs['ping'].wall:.2f}x "
              f"(target <= 3x)")
    if image:
        for label, t in image.items():
            print(f"{'image':>5} {label:>9} {t.wall:>7.1f} {t.controller_cpu:>8.1f} {t.controller_cpu:>9.2f} "
                  f"{t.hosts_cpu:>9.1f} {t.hosts_cpu:>9.2f} {t.floor:>7.1f} {t.other_cpu:>7.1f}")
        bare = next((runs["join"] for size, runs in rows if size == 1), None)
        if bare:
            print(f"image first join / bare first join (1 host): {image['join'].wall / bare.wall:.2f}x")
    if len(rows) > 1:
        first, last = rows[0][1], rows[-1][1]
        print(f"largest/smallest first join: {last['join'].wall / first['join'].wall:.2f}x "
              f"(target < 1.5x with --host-cpus); no-change re-run {last['re-run'].wall / first['re-run'].wall:.2f}x")

if __name__ == "__main__":
    main()
