"""The doctor's ssh probe uses the key the join will: `~` in privateKeyFile is $HOME's."""

from __future__ import annotations

from corral.doctor.onprem import ssh_argv
from corral.model.loader import load_cluster

from .conftest import ROOT


def test_the_probe_reads_the_key_under_home_as_ansible_does(monkeypatch, tmp_path):
    # ansible-core's ssh plugin expands the key with os.path.expanduser, i.e. $HOME; ssh(1)
    # given `~` would use the passwd entry's home instead, so the two would differ here.
    monkeypatch.setenv("HOME", str(tmp_path))
    cluster = load_cluster(ROOT / "clusters" / "jaguar.yaml")
    pool = next(p for p in cluster.node_pools if p.provider == "onprem")
    argv = ssh_argv(cluster, pool, pool.host_names[0])
    assert argv[argv.index("-i") + 1] == f"{tmp_path}/.ssh/corral_sf1"
