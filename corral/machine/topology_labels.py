"""A cloud pool node's network topology as node labels (issue 29 item 2), added at boot to the
kubelet's --node-labels in the join configuration, before kubeadm joins: the labels GKE and EKS
set on their own nodes, which Kueue's Topology for each cloud names as its levels
(corral/manifests/kueue.py GCP_LEVELS, AWS_LEVELS; docs/scheduling.md).

  AWS    EC2 DescribeInstanceTopology for this instance (signed with Signature Version 4 with
         the instance's IMDSv2 role credentials): its networkNodeSet, the network nodes from
         the top layer down (EC2 API Reference, InstanceTopology: "null or empty if the
         instance type is not supported"; signed by corral/machine/sigv4.py, written beside
         the script as the cloud client's pods ship it), as topology.k8s.aws/network-node-layer-1, -2,
         -3 (and -4 on types with four layers), the labels EKS sets (EKS User Guide, "Place
         distributed AI/ML workloads with network topology labels",
         docs.aws.amazon.com/eks/latest/userguide/ml-workload-topology.html). The pool's
         identity needs ec2:DescribeInstanceTopology (`AWS_PERMISSIONS`,
         corral/infra/aws/nodepools.py).
  GCP    the metadata server's instance/attributes/physical_host, "/<block>/<sub-block>/
         <host>" on compactly placed VMs (404 elsewhere), as cloud.google.com/gce-topology-
         block, -subblock and -host, GKE's labels (Google Cloud AI Hypercomputer, "Schedule
         GKE workloads with Topology Aware Scheduling": "Topology of GKE nodes"; Compute
         Engine, "View Compute Engine instance topology" for block > sub-block > host). The
         same attribute split the same way, broadest first, is what Google's own GKE node
         labelling daemon reads (GoogleCloudPlatform, label-nodes-daemon.py: physical_host
         .split("/")[1:]). No permission: metadata needs none.
  Azure  no part: Azure has no per-VM topology API; a pool's proximity placement group is
         the level (Kueue's Azure Topology packs by pool, corral.dev/pool).

May a kubelet set these with --node-labels? Yes: the kubelet refuses at start, and
NodeRestriction refuses at admission, only labels in the kubernetes.io and k8s.io namespaces
outside its allowed set, and node-restriction.kubernetes.io (KEP "Bounding Self-Labeling
Kubelets"; k8s.io/api core/v1 well_known_labels.go LabelNamespaceNodeRestriction;
k8s.io/kubelet pkg/apis well_known_labels.go IsKubeletLabel). topology.k8s.aws/ and
cloud.google.com/ are in neither namespace (k8s.aws is not k8s.io).

The script never fails the boot: without an answer the node joins without the labels and the
script says why in the boot log (docs/scheduling.md: such nodes are one domain per pool).
"""

from __future__ import annotations

from pathlib import Path

from corral.model import Cluster

from . import sigv4
from .files import File, render
from .kubeadm import KUBEADM_DIR
from .kubelet_node import METADATA_URL
from .part import Part, Phase

SCRIPT = "/usr/local/sbin/corral-topology-labels"
# Where the script finds corral's SigV4 signer (sigv4.py, the same file the cloud client's pods ship).
LIB_DIR = "/usr/local/lib/corral"
SIGV4_FILE = f"{LIB_DIR}/sigv4.py"
JOIN_CONFIG = f"{KUBEADM_DIR}/join.yaml"    # pool_node.part's join configuration
# EC2's regional Query API endpoint (AWS General Reference, "Amazon EC2 endpoints").
EC2_URL = "https://ec2.{region}.amazonaws.com"
AWS_LAYER_LABEL = "topology.k8s.aws/network-node-layer-{layer}"
GCP_LABELS = ("cloud.google.com/gce-topology-block", "cloud.google.com/gce-topology-subblock",
              "cloud.google.com/gce-topology-host")
# What the script calls on AWS, for the pool's IAM policy.
AWS_PERMISSIONS = ("ec2:DescribeInstanceTopology",)
CLOUDS_WITH_TOPOLOGY = ("aws", "gcp")


def render_script(cloud: str, metadata_url: str = METADATA_URL, ec2_url: str = EC2_URL,
                  join_config: str = JOIN_CONFIG, lib_dir: str = LIB_DIR) -> str:
    """The boot script for `cloud`; `metadata_url`, `ec2_url`, `join_config` and `lib_dir` replace the
    real ones in tests only (a fake metadata server and EC2 API, a temporary join configuration)."""
    if cloud not in CLOUDS_WITH_TOPOLOGY:
        raise ValueError(f"no topology labels on cloud {cloud!r} (corral reads them on "
                         f"{', '.join(CLOUDS_WITH_TOPOLOGY)})")
    return render("scripts/topology-labels.py.j2", cloud=cloud, metadata_url=metadata_url, ec2_url=ec2_url,
                  join_config=join_config, lib_dir=lib_dir, aws_layer_label=AWS_LAYER_LABEL,
                  gcp_labels=list(GCP_LABELS))


def sigv4_file() -> File:
    """corral's SigV4 signer as a file on the machine (the script signs its EC2 call with it)."""
    return File(SIGV4_FILE, Path(sigv4.__file__).read_text(), "0644")


def part(cluster: Cluster) -> Part:
    """The script (and on AWS its signer), run after the join configuration is written and before
    the pool node's join script (same phase, earlier part in roles.pool_node_role). Nothing on Azure."""
    cloud = cluster.control_plane.cloud
    if cloud not in CLOUDS_WITH_TOPOLOGY:
        return Part(())
    files = (File(SCRIPT, render_script(cloud), "0755"), *((sigv4_file(),) if cloud == "aws" else ()))
    return Part(files, (SCRIPT,), Phase.SERVICE)
