"""`python -m tests.kube up DIR [CLUSTER_FILE]` / `down DIR`: the kube lab from a shell
(scripts/kube-lab). `up` prints the admin kubeconfig's path as its last line. Without a
cluster file it runs the kube tier's cluster (lab.lab_cluster_file)."""

from __future__ import annotations

import sys
from pathlib import Path

from .lab import STATE_FILE, KubeLab, KubeLabError, KubeUnavailable, bin_dir, built_version, lab_cluster_file

USAGE = "usage: scripts/kube-lab up DIR [CLUSTER_FILE] | down DIR"


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("up", "down") or (argv[0] == "down" and len(argv) != 2) or len(argv) > 3:
        print(USAGE, file=sys.stderr)
        return 2
    root = Path(argv[1]).resolve()
    if argv[0] == "down":
        if not (root / STATE_FILE).exists():
            print(f"kube-lab: no lab in {root}", file=sys.stderr)
            return 1
        KubeLab.load(root).down()
        print(f"kube-lab: stopped the lab in {root}")
        return 0
    try:
        bins = bin_dir()
        cluster = (Path(argv[2]).resolve() if len(argv) == 3
                   else lab_cluster_file(root.parent / f"{root.name}-clusters", built_version(bins)))
        lab = KubeLab(root, cluster, bins).up()
    except KubeUnavailable as why:
        print(f"kube-lab: {why}", file=sys.stderr)
        return 3
    except KubeLabError as why:
        print(f"kube-lab: {why}", file=sys.stderr)
        return 1
    print(f"kube-lab: {lab.server} (etcd, kube-apiserver, kube-controller-manager, kube-scheduler; "
          f"logs in {root / 'logs'}); stop it with: scripts/kube-lab down {root}")
    print(lab.kubeconfig)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
