"""The fit arithmetic of `corral capacity --fits`, by property tests (hypothesis).

The oracle is an exhaustive search: every way of putting the job's pods on
the nodes, one pod's GPUs on one node, without going over any node's free
GPUs. It knows nothing of `floor(free / pod_gpus)`, so it checks that formula
rather than repeating it."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.manifests import monitoring
from corral.usage import capacity
from corral.usage.capacity import ClusterCapacity, GpuNode, JobShape, fit, pods_that_fit


def placeable(free: list[int], pods: int, gpus_per_pod: int) -> bool:
    """Whether `pods` pods of `gpus_per_pod` GPUs can be put on nodes with these free GPUs (brute force)."""
    for assignment in itertools.product(range(len(free)), repeat=pods):
        load = [0] * len(free)
        for node in assignment:
            load[node] += gpus_per_pod
        if all(used <= room for used, room in zip(load, free)):
            return True
    return pods == 0


small_free = st.lists(st.integers(0, 9), min_size=1, max_size=4)


@settings(max_examples=300, deadline=None)
@given(free=small_free, pods=st.integers(1, 5), gpus_per_pod=st.integers(1, 8))
def test_fits_iff_the_pods_of_each_node_add_up(free, pods, gpus_per_pod):
    assert (pods_that_fit(free, gpus_per_pod) >= pods) == placeable(free, pods, gpus_per_pod)


NODE = st.fixed_dictionaries({
    "pool": st.sampled_from(["p1", "p2"]),
    "rack": st.sampled_from(["", "r1", "r2"]),
    "reserved_for": st.sampled_from(["", "", "robotics", "vision"]),
    "model": st.sampled_from(["H100", "H100", "A100"]),
    "allocatable": st.just(8),
    "used": st.integers(0, 8),
    "out_of_service": st.sampled_from([[], [], [], ["cordoned"]]),
})


def _cluster(specs: list[dict]) -> ClusterCapacity:
    nodes = [GpuNode("c", f"n{i}", **spec) for i, spec in enumerate(specs)]
    return ClusterCapacity("c", "http://127.0.0.1:9090", 0.0, nodes)


@settings(max_examples=300, deadline=None)
@given(specs=st.lists(NODE, min_size=1, max_size=5), pods=st.integers(1, 4), gpus_per_pod=st.integers(1, 8),
       team=st.sampled_from([None, "robotics", "vision"]))
def test_each_level_fits_iff_its_nodes_can_hold_the_pods(specs, pods, gpus_per_pod, team):
    cluster = _cluster(specs)
    answer = fit(cluster, JobShape(pods, gpus_per_pod, "H100"), team)

    def usable(node: GpuNode) -> bool:  # spelled out again, not through capacity.eligible
        return (node.model == "H100" and not node.out_of_service
                and (node.reserved_for == "" or node.reserved_for == team))

    nodes = [n for n in cluster.nodes if usable(n)]
    free = {n.name: n.allocatable - n.used for n in nodes}
    assert answer.fits == placeable(list(free.values()) or [0], pods, gpus_per_pod)
    racks = {f"{n.pool}/{n.rack}" for n in nodes if n.rack}
    assert answer.racks == sorted(r for r in racks if placeable(
        [free[n.name] for n in nodes if f"{n.pool}/{n.rack}" == r], pods, gpus_per_pod))
    pools = {n.pool for n in nodes}
    assert answer.pools == sorted(p for p in pools if placeable(
        [free[n.name] for n in nodes if n.pool == p], pods, gpus_per_pod))
    assert answer.hosts == sorted(name for name, room in free.items() if placeable([room], pods, gpus_per_pod))
    # The tightest level holds the job; a fit in a host, rack or pool is a fit in the cluster.
    expected = ("host" if answer.hosts else "rack" if answer.racks else "pool" if answer.pools
                else "cluster" if answer.fits else None)
    assert answer.level == expected
    assert not (answer.hosts or answer.racks or answer.pools) or answer.fits


def test_the_node_labels_read_are_the_ones_kube_state_metrics_exports():
    assert set(capacity.NODE_LABELS.values()) <= set(monitoring.NODE_LABELS)
    assert capacity.RACK == "label_corral_dev_rack" and capacity.MODEL == "label_corral_dev_gpu_model"
    assert capacity.ksm_label("topology.kubernetes.io/zone") == "label_topology_kubernetes_io_zone"
    assert capacity.ksm_label("example.com/gpuModel") == "label_example_com_gpu_model"
