"""corral's version catalog: every version of Kubernetes and of what corral installs with it, in one place.

One row per Kubernetes minor (MINORS): its release and end-of-life dates, the
patch releases corral knows, and the per-minor components: kubeadm's config
API, pause, etcd and CoreDNS, the containerd lines containerd recommends and
the containerd corral installs by default, the NVIDIA driver branch, and the
add-ons released per Kubernetes minor (cluster-autoscaler, kube-state-metrics,
scheduler-plugins). Components that do not follow the minor (flannel, the
NVIDIA device plugin, Prometheus, Kueue, ...) are the module constants below
the rows. Release lines with an end of life of their own (containerd's,
NVIDIA's driver branches) are CONTAINERD_LINES and DRIVER_BRANCHES.

Every value carries its source: the upstream file or page it was read from.
A component upstream has not released for a minor is a Pin without a value
whose `missing` says so; nothing here is a guess. docs/versions.md has the
table and the sources; tests/model/test_versions_catalog.py checks that the
supported rows are complete and that none pins a line past its end of life.

Adding a minor (1.38 when it is released): one Minor row, read from the same
sources, then `corral manifests --validate` for each cluster and the goldens.
Other modules read these values; a test fails if one writes a version
literal of its own (model/containerd.py, manifests/versions.py, machine/
kubeadm.py and scheduler.py, upgrade/versions.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, timedelta

# Warn this long before a minor's end of life (support_problem).
EOL_WARNING = timedelta(days=60)


# --- Sources ------------------------------------------------------------------
# Read 2026-12-07 (the research notes behind this change); each snapshot's date is given
# where the source was a repository snapshot, so "newest" means newest at that date.

K8S_RELEASES = "kubernetes.io/releases (the 1.3x pages) and kubernetes/sig-release releases/release-1.3x/README.md"
K8S_EOL_YAML = "kubernetes/website data/releases/eol.yaml (endOfLifeDate, finalPatchRelease)"
K8S_PATCHES = ("kubernetes.io/releases/1.3x pages (crawled to ~Sept 2026) and the Go module proxy "
               "(k8s.io/kubernetes v1.37.2); releases after Oct 2026 not seen")
KUBEADM_CONSTANTS = ("kubernetes cmd/kubeadm/app/constants/constants.go at v{tag} "
                     "(Go module zip k8s.io/kubernetes@v{tag})")
KUBEADM_API = ("kubernetes cmd/kubeadm/app/apis/kubeadm/scheme/scheme.go and app/util/config/common.go at v{tag}: "
               "{what}")
CONTAINERD_RELEASES = ("containerd RELEASES.md, \"Kubernetes Support\" (github.com/containerd/containerd; "
                       "the 1.37 row from the v2.4.2 tag, 2026-10-13)")
CONTAINERD_RELEASES_OLD = ("containerd RELEASES.md, \"Kubernetes Support\", from the file's history (it drops rows "
                           "as Kubernetes versions leave support): 1.26-1.28 (2024-09), 1.29 (2025-04), "
                           "1.30 (2025-09), 1.31 (2025-12), 1.32-1.36 (2026-07)")
CONTAINERD_LINES_SOURCE = "containerd RELEASES.md, \"Current State\" table, at the v2.4.2 tag (2026-10-13)"
NVIDIA_DRIVERS = ("docs.nvidia.com/datacenter/tesla/drivers/<615|620>/"
                  "supported-drivers-and-cuda-toolkit-versions.html (page updated 2026-09-09); NVIDIA gives the "
                  "month only, taken as its last day")
AUTOSCALER_TAGS = "kubernetes/autoscaler tags cluster-autoscaler-1.x.y (snapshot 2026-08-22)"
KSM_MATRIX = ("kube-state-metrics README.md, \"Compatibility matrix\" (github.com/kubernetes/kube-state-metrics, "
              "2026-08-20)")
SCHEDULER_PLUGINS = ("kubernetes-sigs/scheduler-plugins tags and README \"Compatibility Matrix\" (snapshot "
                     "2026-08-16): newest release v0.34.7 (2026-04-20, built with Kubernetes 1.34.7), only "
                     "v0.35.4-devel for 1.35, nothing for 1.36 or 1.37")
PAUSE_OLD = ("kubeadm's PauseVersion (kubernetes cmd/kubeadm/app/constants/constants.go; 1.29 and 1.30 \"3.9\", "
             "1.31 and 1.32 \"3.10\", as `kubeadm config images list` prints them)")


@dataclass(frozen=True)
class Pin:
    """One version corral installs, and where it was read. `value` None: upstream has
    no release for this (yet); `missing` says which and where that was checked."""

    value: str | None
    source: str
    missing: str = ""

    def __post_init__(self) -> None:
        if not self.source:
            raise ValueError(f"pin {self.value!r} has no source")
        if self.value is None and not self.missing:
            raise ValueError("a pin without a value must say why (missing=)")


@dataclass(frozen=True)
class Line:
    """A release line with an end of life of its own (a containerd line, an NVIDIA driver branch)."""

    name: str
    status: str
    end_of_life: date
    source: str


@dataclass(frozen=True)
class ContainerdSupport:
    """containerd's "Kubernetes Support" row for a minor: per containerd line, the lowest
    release it recommends; a line not listed is not supported there. `corral_adds`: lines
    corral also takes for the minor, each for the reason in `why` (never silently)."""

    minimums: dict[str, str]
    source: str
    corral_adds: dict[str, str] = field(default_factory=dict)
    why: str = ""

    def accepted(self) -> dict[str, str]:
        return {**self.minimums, **self.corral_adds}


@dataclass(frozen=True)
class Minor:
    """One Kubernetes minor and what corral runs with it. A field left None is a fact corral
    has not recorded for the minor (old rows, kept for the clusters that still run them)."""

    minor: str
    end_of_life: date
    dates_source: str
    released: date | None = None
    # The newest patch release corral has seen (patches .0 to it exist), None: not recorded; with
    # patches_final, the minor's last (no later patch will come).
    latest_patch: int | None = None
    patches_final: bool = False
    patches_source: str = K8S_PATCHES
    kubeadm_api: Pin | None = None
    pause: Pin | None = None
    etcd: Pin | None = None              # kubeadm's DefaultEtcdVersion (stacked etcd; corral runs its own)
    min_external_etcd: Pin | None = None  # kubeadm's MinExternalEtcdVersion (corral's etcd must be at least this)
    coredns: Pin | None = None
    containerd: ContainerdSupport | None = None
    containerd_default: Pin | None = None  # what a cluster file without kubernetes.containerd gets
    runc: Pin | None = None                # the runc inside containerd_default's containerd.io
    driver_branch: Pin | None = None       # the NVIDIA data-centre branch corral recommends
    cluster_autoscaler: Pin | None = None
    kube_state_metrics: Pin | None = None
    scheduler_plugins: Pin | None = None


# The per-minor components a supported row must have (a Pin, with a value or the reason it has none).
ROW_COMPONENTS = ("kubeadm_api", "pause", "etcd", "min_external_etcd", "coredns", "containerd",
                  "containerd_default", "runc", "driver_branch", "cluster_autoscaler", "kube_state_metrics",
                  "scheduler_plugins")

_NO_SCHEDULER_PLUGINS = Pin(None, SCHEDULER_PLUGINS, missing=(
    "scheduler-plugins has no release for Kubernetes 1.35 or later (kubernetes-sigs/scheduler-plugins tags: "
    "the newest, v0.34.7, is for 1.34)"))

# containerd.io, Docker's package, on Debian 12 "bookworm": the packages corral knows, each with
# its Debian version (`apt-get install containerd.io=<version>`).
CONTAINERD_PACKAGE = "containerd.io"
CONTAINERD_PACKAGES_SOURCE = (
    "1.6 and 1.7: debian/changelog of github.com/docker/containerd-packaging (main for 1.7, release/1.6; retired "
    "after 1.7.27). 2.x: built by github.com/docker/packaging (docker-bake.hcl target debian12: release "
    "debian, id 12, suite bookworm; hack/scripts/gen-deb-changelog.sh names the version "
    "<version>-<revision>~debian.12~bookworm; containerd's default branch release/2.3 since 2026-04-15); "
    "versions and revisions as public install logs showed them (mostly Ubuntu and Debian 13 hosts). "
    "UNCONFIRMED for bookworm: no listing of download.docker.com/linux/debian/dists/bookworm/pool/stable was read"
)
_BOOKWORM = "~debian.12~bookworm"
CONTAINERD_PACKAGES: dict[str, str] = {
    **{f"2.3.{patch}": f"2.3.{patch}-{revision}{_BOOKWORM}" for patch, revision in ((6, 1), (5, 1), (4, 2), (3, 1))},
    **{f"2.2.{patch}": f"2.2.{patch}-{revision}{_BOOKWORM}" for patch, revision in ((4, 1), (2, 1), (1, 1), (0, 2))},
    **{f"1.7.{patch}": f"1.7.{patch}-1" for patch in range(18, 28)},
    "1.6.33": "1.6.33-1",
    "1.6.32": "1.6.32-1",
    "1.6.31": "1.6.31-1",
    "1.6.28": "1.6.28-2",
}

# What the clusters of the old rows get without kubernetes.containerd (1.29-1.33 recommend 1.7.24+).
_CONTAINERD_1_7 = Pin("1.7.27", "the newest 1.7 (LTS) release docker/containerd-packaging built (debian/changelog)")
# The default of the supported rows: containerd 2.3, the LTS line (RELEASES.md: LTS to 2028-04-30).
_CONTAINERD_2_3 = Pin("2.3.6", "containerd RELEASES.md \"Current State\": 2.3 is LTS to 2028-04-30; 2.3.6-1 is the "
                      "newest containerd.io 2.3 package seen (CONTAINERD_PACKAGES, UNCONFIRMED for bookworm)")
_RUNC_OF_2_3_6 = Pin("1.5.1", "containerd script/setup/runc-version at v2.3.6 (read in the Go module "
                     "github.com/containerd/containerd/v2@v2.3.6): the runc containerd 2.3.6 is built and tested "
                     "with; runc CHANGELOG.md: CVE-2025-31133, -52565 and -52881 are fixed from 1.4.0-rc.3 (and "
                     "1.2.8, 1.3.3). Docker's containerd.io build of 2.3.6-1 was not read")
_DRIVER_R580 = Pin("R580", NVIDIA_DRIVERS + ": R580 is a long-term support branch (LTSB) to June 2028, and the last "
                   "branch for Volta, Pascal and Maxwell (cuda-toolkit-driver-and-architecture-matrix.html)")
_V1BETA4 = "v1beta4"


def _image(repository: str, tag: str | None, source: str, missing: str = "") -> Pin:
    return Pin(f"{repository}:{tag}" if tag else None, source, missing)


_CA = "registry.k8s.io/autoscaling/cluster-autoscaler"
_KSM = "registry.k8s.io/kube-state-metrics/kube-state-metrics"
_SP = "registry.k8s.io/scheduler-plugins/kube-scheduler"
_KSM_OLD = (KSM_MATRIX + " as of 2024: v2.13.0 is built with client-go v1.30, v2.14.0 with v1.31; both watch the "
            "same default resources (monitoring.KSM_RESOURCES); v2.14.0 drops only "
            "kube_endpoint_address_not_ready/_available, which corral does not read")
_CA_OLD = ("kubernetes/autoscaler releases: cluster-autoscaler is released per Kubernetes minor and supports only "
           "its own")
_SP_OLD = "kubernetes-sigs/scheduler-plugins releases: one release line per Kubernetes minor"
# kubernetes/autoscaler tags (snapshot 2026-08-22); the image tag follows the git tag (version.go).
_CA_TAG = "kubernetes/autoscaler tag cluster-autoscaler-{tag} ({day}; snapshot 2026-08-22)"
# kube-state-metrics: the README's "Compatibility matrix" and go.mod at the tag (snapshot 2026-08-20).
_KSM_ROW = KSM_MATRIX + ": {tag} is the newest release built with client-go {client} (go.mod at the tag)"

MINORS: dict[str, Minor] = {row.minor: row for row in (
    Minor("1.26", date(2024, 2, 28), K8S_EOL_YAML, latest_patch=15, patches_final=True, patches_source=K8S_EOL_YAML,
          containerd=ContainerdSupport({"1.7": "1.7.0", "1.6": "1.6.15"}, CONTAINERD_RELEASES_OLD),
          containerd_default=_CONTAINERD_1_7),
    Minor("1.27", date(2024, 7, 16), K8S_EOL_YAML, latest_patch=16, patches_final=True, patches_source=K8S_EOL_YAML,
          containerd=ContainerdSupport({"1.7": "1.7.0", "1.6": "1.6.15"}, CONTAINERD_RELEASES_OLD),
          containerd_default=_CONTAINERD_1_7),
    Minor("1.28", date(2024, 10, 22), K8S_EOL_YAML, latest_patch=15, patches_final=True,
          patches_source=K8S_EOL_YAML,
          containerd=ContainerdSupport({"1.7": "1.7.0", "1.6": "1.6.15"}, CONTAINERD_RELEASES_OLD),
          containerd_default=_CONTAINERD_1_7),
    Minor("1.29", date(2025, 2, 28), K8S_EOL_YAML, latest_patch=14, patches_final=True, patches_source=K8S_EOL_YAML,
          kubeadm_api=Pin("v1beta3", "kubeadm v1beta4 is served from 1.31 (kubernetes.io kubeadm-config.v1beta4)"),
          pause=Pin("3.9", PAUSE_OLD),
          containerd=ContainerdSupport({"1.7": "1.7.11", "1.6": "1.6.27"}, CONTAINERD_RELEASES_OLD),
          containerd_default=_CONTAINERD_1_7,
          scheduler_plugins=_image(_SP, "v0.29.7", _SP_OLD)),
    # End of life: kubernetes.io/releases gave 2025-06-28 (eol.yaml records the last patch's date, 2025-07-15).
    Minor("1.30", date(2025, 6, 28), K8S_RELEASES, latest_patch=14, patches_final=True,
          patches_source=K8S_EOL_YAML,
          kubeadm_api=Pin("v1beta3", "kubeadm v1beta4 is served from 1.31 (kubernetes.io kubeadm-config.v1beta4)"),
          pause=Pin("3.9", PAUSE_OLD),
          containerd=ContainerdSupport({"2.1": "2.1.0", "2.0": "2.0.0", "1.7": "1.7.13", "1.6": "1.6.28"},
                                       CONTAINERD_RELEASES_OLD),
          containerd_default=_CONTAINERD_1_7,
          cluster_autoscaler=_image(_CA, "v1.30.2", _CA_OLD),
          kube_state_metrics=_image(_KSM, "v2.13.0", _KSM_OLD),
          scheduler_plugins=_image(_SP, "v0.30.6", _SP_OLD)),
    # End of life: kubernetes.io/releases gave 2025-10-28 (eol.yaml: 2025-11-11, the last patch).
    Minor("1.31", date(2025, 10, 28), K8S_RELEASES, latest_patch=14, patches_final=True,
          patches_source=K8S_EOL_YAML,
          kubeadm_api=Pin(_V1BETA4, "kubeadm v1beta4 is served from 1.31 (kubernetes.io kubeadm-config.v1beta4)"),
          pause=Pin("3.10", PAUSE_OLD),
          containerd=ContainerdSupport({"2.1": "2.1.0", "2.0": "2.0.0", "1.7": "1.7.20", "1.6": "1.6.34"},
                                       CONTAINERD_RELEASES_OLD),
          containerd_default=_CONTAINERD_1_7,
          cluster_autoscaler=_image(_CA, "v1.31.0", _CA_OLD),
          kube_state_metrics=_image(_KSM, "v2.14.0", _KSM_OLD),
          scheduler_plugins=_image(_SP, "v0.31.8", _SP_OLD)),
    Minor("1.32", date(2026, 2, 28), K8S_RELEASES, latest_patch=13, patches_final=True,
          patches_source=K8S_EOL_YAML,
          kubeadm_api=Pin(_V1BETA4, "kubeadm v1beta4 is served from 1.31 (kubernetes.io kubeadm-config.v1beta4)"),
          pause=Pin("3.10", PAUSE_OLD),
          etcd=Pin("3.5.24-0", KUBEADM_CONSTANTS.format(tag="1.32.13") + " DefaultEtcdVersion (3.5.16-0 at 1.32.0)"),
          min_external_etcd=Pin("3.5.24-0", KUBEADM_CONSTANTS.format(tag="1.32.13")
                                + " MinExternalEtcdVersion (3.5.11-0 at 1.32.0)"),
          coredns=Pin("v1.11.3", KUBEADM_CONSTANTS.format(tag="1.32.13") + " CoreDNSVersion"),
          containerd=ContainerdSupport({"2.1": "2.1.0", "2.0": "2.0.1", "1.7": "1.7.24", "1.6": "1.6.36"},
                                       CONTAINERD_RELEASES_OLD),
          containerd_default=_CONTAINERD_1_7,
          cluster_autoscaler=_image(_CA, "v1.32.7", _CA_TAG.format(tag="1.32.7", day="2026-02-13")),
          kube_state_metrics=_image(_KSM, "v2.16.0", _KSM_ROW.format(tag="v2.16.0", client="v0.32.6"))),
    Minor("1.33", date(2026, 6, 28), K8S_RELEASES, released=date(2025, 4, 23), latest_patch=13, patches_final=True,
          patches_source="kubernetes/website PRs 56364 and 57353 (1.33.13 the final patch, 1.33 marked EOL)",
          kubeadm_api=Pin(_V1BETA4, KUBEADM_API.format(tag="1.33.13", what="v1beta4 preferred, v1beta3 deprecated")),
          pause=Pin("3.10", KUBEADM_CONSTANTS.format(tag="1.33.13") + " PauseVersion"),
          etcd=Pin("3.5.24-0", KUBEADM_CONSTANTS.format(tag="1.33.13") + " DefaultEtcdVersion (3.5.21-0 at 1.33.0)"),
          min_external_etcd=Pin("3.5.24-0", KUBEADM_CONSTANTS.format(tag="1.33.13")
                                + " MinExternalEtcdVersion (3.5.11-0 at 1.33.0)"),
          coredns=Pin("v1.12.0", KUBEADM_CONSTANTS.format(tag="1.33.13") + " CoreDNSVersion"),
          containerd=ContainerdSupport({"2.1": "2.1.0", "2.0": "2.0.4", "1.7": "1.7.24", "1.6": "1.6.36"},
                                       CONTAINERD_RELEASES_OLD),
          containerd_default=_CONTAINERD_1_7,
          cluster_autoscaler=_image(_CA, "v1.33.6", _CA_TAG.format(tag="1.33.6", day="2026-07-22")),
          kube_state_metrics=_image(_KSM, "v2.17.0", _KSM_ROW.format(tag="v2.17.0", client="v0.33.4"))),
    # 1.34 wants 1.7.28+, 2.1.3+ or 2.0.6+ and Docker built no 1.7 after 1.7.27: corral takes containerd 2.3
    # (LTS) there as on 1.35, for the same reason, so a cluster on its way from 1.33 moves to containerd 2
    # with this step (corral upgrade --plan).
    Minor("1.34", date(2026, 10, 27), K8S_RELEASES, released=date(2025, 8, 27), latest_patch=12,
          patches_source="k8s.io/kubernetes on the Go module proxy (v1.34.12, 2026-09-23); kubernetes/website PR 57269",
          kubeadm_api=Pin(_V1BETA4, KUBEADM_API.format(tag="1.34.12", what="v1beta4 preferred, v1beta3 deprecated")),
          pause=Pin("3.10.1", KUBEADM_CONSTANTS.format(tag="1.34.12") + " PauseVersion"),
          etcd=Pin("3.6.5-0", KUBEADM_CONSTANTS.format(tag="1.34.12") + " DefaultEtcdVersion (3.6.4-0 at 1.34.0)"),
          min_external_etcd=Pin("3.5.24-0", KUBEADM_CONSTANTS.format(tag="1.34.12")
                                + " MinExternalEtcdVersion (3.5.21-0 at 1.34.0)"),
          coredns=Pin("v1.12.1", KUBEADM_CONSTANTS.format(tag="1.34.12") + " CoreDNSVersion"),
          containerd=ContainerdSupport(
              {"2.1": "2.1.3", "2.0": "2.0.6", "1.7": "1.7.28", "1.6": "1.6.39"}, CONTAINERD_RELEASES_OLD,
              corral_adds={"2.3": "2.3.0"},
              why=("of the lines containerd lists for 1.34, Docker packages no 1.7 after 1.7.27 and corral knows no "
                   "2.0 or 2.1 containerd.io; RELEASES.md: \"Any actively supported version of containerd may "
                   "receive patches to fix bugs encountered in any version of Kubernetes\"; 2.3 (LTS, CRI v1) is "
                   "what 1.35 to 1.37 run, so the move to containerd 2 happens once, here")),
          containerd_default=_CONTAINERD_2_3,
          cluster_autoscaler=_image(_CA, "v1.34.5", _CA_TAG.format(tag="1.34.5", day="2026-07-22")),
          kube_state_metrics=_image(_KSM, "v2.18.0", _KSM_ROW.format(tag="v2.18.0", client="v0.34.3"))),
    Minor(
        "1.35", date(2027, 2, 28), K8S_RELEASES, released=date(2025, 12, 17), latest_patch=9,
        kubeadm_api=Pin(_V1BETA4, KUBEADM_API.format(tag="1.35.4", what="v1beta4 preferred, v1beta3 deprecated")),
        pause=Pin("3.10.1", KUBEADM_CONSTANTS.format(tag="1.35.4") + " PauseVersion"),
        etcd=Pin("3.6.6-0", KUBEADM_CONSTANTS.format(tag="1.35.4") + " DefaultEtcdVersion"),
        min_external_etcd=Pin("3.5.24-0", KUBEADM_CONSTANTS.format(tag="1.35.4") + " MinExternalEtcdVersion"),
        coredns=Pin("v1.13.1", KUBEADM_CONSTANTS.format(tag="1.35.4") + " CoreDNSVersion"),
        containerd=ContainerdSupport(
            {"2.2": "2.2.0", "2.1": "2.1.5", "1.7": "1.7.28"}, CONTAINERD_RELEASES,
            corral_adds={"2.3": "2.3.0"},
            why=("every line containerd lists for 1.35 is past its end of life by 2026-11-06 (1.7: Sept 2026, "
                 "2.1: 2026-07-03, 2.2: 2026-11-06); RELEASES.md: \"Any actively supported version of containerd "
                 "may receive patches to fix bugs encountered in any version of Kubernetes\" and \"containerd "
                 "will ensure there is always a supported version of containerd for every supported version of "
                 "Kubernetes\"; 2.3 (LTS, CRI v1) is the line it lists for 1.36 and 1.37")),
        containerd_default=_CONTAINERD_2_3, runc=_RUNC_OF_2_3_6, driver_branch=_DRIVER_R580,
        cluster_autoscaler=_image(_CA, "v1.35.2", AUTOSCALER_TAGS + ": cluster-autoscaler-1.35.2 (2026-07-22)"),
        kube_state_metrics=_image(_KSM, "v2.19.1", KSM_MATRIX + ": v2.19 is built with client-go v1.35; v2.19.1 "
                                  "(2026-06-11) is its newest patch"),
        scheduler_plugins=_NO_SCHEDULER_PLUGINS,
    ),
    Minor(
        "1.36", date(2027, 6, 28), K8S_RELEASES, released=date(2026, 4, 22), latest_patch=4,
        kubeadm_api=Pin(_V1BETA4, KUBEADM_API.format(tag="1.36.3", what="v1beta4 preferred, v1beta3 deprecated")),
        pause=Pin("3.10.2", KUBEADM_CONSTANTS.format(tag="1.36.3") + " PauseVersion"),
        etcd=Pin("3.6.8-0", KUBEADM_CONSTANTS.format(tag="1.36.3") + " DefaultEtcdVersion"),
        min_external_etcd=Pin("3.5.24-0", KUBEADM_CONSTANTS.format(tag="1.36.3") + " MinExternalEtcdVersion"),
        coredns=Pin("v1.14.2", KUBEADM_CONSTANTS.format(tag="1.36.3") + " CoreDNSVersion"),
        containerd=ContainerdSupport({"2.3": "2.3.0", "2.2": "2.2.0"}, CONTAINERD_RELEASES),
        containerd_default=_CONTAINERD_2_3, runc=_RUNC_OF_2_3_6, driver_branch=_DRIVER_R580,
        cluster_autoscaler=_image(_CA, "v1.36.1", AUTOSCALER_TAGS + ": cluster-autoscaler-1.36.1 (2026-07-22)"),
        kube_state_metrics=_image(_KSM, "v2.20.0", KSM_MATRIX + ": v2.20.0 (2026-08-17) is built with client-go v1.36"),
        scheduler_plugins=_NO_SCHEDULER_PLUGINS,
    ),
    Minor(
        "1.37", date(2027, 10, 28), K8S_RELEASES, released=date(2026, 8, 26), latest_patch=2,
        kubeadm_api=Pin(_V1BETA4, KUBEADM_API.format(
            tag="1.37.2", what="v1beta3 removed (\"use kubeadm v1.36\"); v1beta4 the only API not experimental")),
        pause=Pin("3.10.2", KUBEADM_CONSTANTS.format(tag="1.37.2") + " PauseVersion"),
        etcd=Pin("3.7.0-0", KUBEADM_CONSTANTS.format(tag="1.37.2") + " DefaultEtcdVersion"),
        min_external_etcd=Pin("3.5.24-0", KUBEADM_CONSTANTS.format(tag="1.37.2") + " MinExternalEtcdVersion"),
        coredns=Pin("v1.14.6", KUBEADM_CONSTANTS.format(tag="1.37.2") + " CoreDNSVersion"),
        containerd=ContainerdSupport({"2.4": "2.4.0", "2.3": "2.3.0"}, CONTAINERD_RELEASES),
        containerd_default=_CONTAINERD_2_3, runc=_RUNC_OF_2_3_6, driver_branch=_DRIVER_R580,
        cluster_autoscaler=Pin(None, AUTOSCALER_TAGS + " (branch cluster-autoscaler-release-1.37 exists, no tag)",
                               missing="no cluster-autoscaler release for 1.37 confirmed (kubernetes/autoscaler tags)"),
        # No kube-state-metrics is built with client-go 1.37 yet (the Go module proxy's newest is v2.20.0); the
        # README: "it is recommended to use the latest release", "the maintainers will only support the latest
        # release". Without it no 1.37 cluster renders its monitoring add-on, which every cluster has.
        kube_state_metrics=_image(_KSM, "v2.20.0", KSM_MATRIX + ": no release for client-go v1.37 yet; v2.20.0 "
                                  "(client-go v1.36) is the latest release, which the README recommends and "
                                  "the maintainers support"),
        scheduler_plugins=_NO_SCHEDULER_PLUGINS,
    ),
)}

# The minors corral builds new clusters with: each row has every component (ROW_COMPONENTS).
SUPPORTED_MINORS = ("1.35", "1.36", "1.37")

# containerd's release lines and their end of life.
CONTAINERD_LINES: dict[str, Line] = {line.name: line for line in (
    Line("1.6", "End of Life", date(2025, 8, 23), CONTAINERD_LINES_SOURCE),
    Line("1.7", "LTS, extended (committers' support ended 2026-03-10)", date(2026, 9, 30),
         CONTAINERD_LINES_SOURCE + ": \"September 2026\", taken as its last day"),
    Line("2.0", "LTS, extended (committers' support ended 2025-11-07)", date(2027, 3, 31),
         CONTAINERD_LINES_SOURCE + ": \"March, 2027\", taken as its last day"),
    Line("2.1", "End of Life", date(2026, 7, 3), CONTAINERD_LINES_SOURCE),
    Line("2.2", "Active", date(2026, 11, 6), CONTAINERD_LINES_SOURCE),
    Line("2.3", "LTS", date(2028, 4, 30), CONTAINERD_LINES_SOURCE),
    Line("2.4", "Active (from 2026-09-16)", date(2027, 5, 16), CONTAINERD_LINES_SOURCE),
)}

# NVIDIA data-centre driver branches with a published end of life.
DRIVER_BRANCHES: dict[str, Line] = {line.name: line for line in (
    Line("R535", "long-term support branch (LTSB)", date(2026, 6, 30), NVIDIA_DRIVERS + " (615 page)"),
    Line("R580", "long-term support branch (LTSB)", date(2028, 6, 30), NVIDIA_DRIVERS + " (615 and 620 pages)"),
    Line("R595", "production branch (PB)", date(2027, 3, 31), NVIDIA_DRIVERS + " (615 and 620 pages)"),
    Line("R610", "new feature branch (NFB)", date(2026, 8, 31), NVIDIA_DRIVERS + " (615 page)"),
    Line("R620", "long-term support branch (LTSB)", date(2029, 9, 30), NVIDIA_DRIVERS + " (620 page)"),
)}

# --- Components that do not follow the Kubernetes minor ---------------------------------------

# The etcd corral's dedicated members run (corral/machine/etcd_member.py), one version for every
# supported minor: at or above each row's min_external_etcd (kubeadm refuses an external etcd
# below it in preflight) and on a line etcd supports. 3.6 is the line kubeadm 1.35 and 1.36
# default to (3.6.6-0, 3.6.8-0); 1.37's default is 3.7.0-0.
ETCD_MEMBER = Pin("3.6.17", "go.etcd.io/etcd/server/v3 versions on the Go module proxy (v3.6.17, the newest 3.6, "
                  "with v3.7.0 to v3.7.4); etcd.io/docs upgrades/upgrade_3_6: members on 3.5 go to the newest "
                  "3.5 patch (3.5.26 or later) before 3.6, one minor at a time")
# Images the add-on manifests run (corral/manifests/versions.py reads them). How to bump: change the
# pin here, run `corral manifests <cluster> --validate` for each cluster, regenerate the goldens
# (`CORRAL_UPDATE_GOLDEN=1 pytest tests/manifests`) and review the diff: it must show only the image
# lines and whatever the new release needs. docs/versions.md lists the newest upstream releases seen.

# flannel: the daemon and the CNI plugin binary it installs, released together.
FLANNEL = Pin("docker.io/flannel/flannel:v0.26.1",
              "github.com/flannel-io/flannel releases (v0.26.1 lists the matching cni-plugin tag)")
FLANNEL_CNI_PLUGIN = Pin("docker.io/flannel/flannel-cni-plugin:v1.5.1-flannel2",
                         "github.com/flannel-io/flannel releases, v0.26.1")
# NetworkPolicy beside flannel (flannel enforces none itself; its chart's `netpol.enabled` runs this
# same engine as a sidecar, Documentation/netpol.md since v0.25.5). v1.1.1 is the first release that
# leaves hostNetwork pods out of a policy's managed addresses (commit 486e36f): before it, a policy
# selecting a hostNetwork pod (say node-exporter) put the node's own address under the policy.
KUBE_NETWORK_POLICIES = Pin("registry.k8s.io/networking/kube-network-policies:v1.1.1",
                            "github.com/kubernetes-sigs/kube-network-policies tags; install.yaml at main names "
                            "this image (commit ee995c5)")
# NVIDIA device plugin: the last patch release of v0.17 (CHANGELOG.md, v0.17.1-v0.17.4: fixes only).
# v0.17.0 marked a GPU unhealthy, and took it out of the node's allocatable GPUs until the plugin
# restarted, on Xid 109 (a context-switch timeout a job causes); v0.17.1 ignores it, as corral's own
# health classes do (corral/model/schema.py, DEFAULT_*_XIDS).
NVIDIA_DEVICE_PLUGIN = Pin("nvcr.io/nvidia/k8s-device-plugin:v0.17.4",
                           "github.com/NVIDIA/k8s-device-plugin CHANGELOG.md (v0.17.1-v0.17.4)")
# dcgm-exporter's tag is <DCGM version>-<exporter version>-<base image>: the newest DCGM 3 release
# (the next is 4.0.0-4.0.1, DCGM 4, a major version of its own). Its counters are corral's file, not
# the image's default (monitoring.DCGM_COUNTERS).
DCGM_EXPORTER = Pin("nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04", "github.com/NVIDIA/dcgm-exporter tags")
# Mellanox's shared RDMA device plugin (RoCE pools' HCAs for pods): its release workflow pushes each
# tag to ghcr.io/mellanox as a multi-arch image (.github/workflows/release.yaml).
RDMA_SHARED_DEVICE_PLUGIN = Pin("ghcr.io/mellanox/k8s-rdma-shared-dev-plugin:v1.5.3",
                                "github.com/Mellanox/k8s-rdma-shared-dev-plugin tags: v1.5.3 (2025-03-26), the "
                                "newest vX.Y.Z tag")
PROMETHEUS = Pin("quay.io/prometheus/prometheus:v2.55.1", "github.com/prometheus/prometheus releases")
NODE_EXPORTER = Pin("quay.io/prometheus/node-exporter:v1.8.2", "github.com/prometheus/node_exporter releases")
GRAFANA = Pin("docker.io/grafana/grafana:11.3.1", "github.com/grafana/grafana releases")
# Kueue (issue 29; docs/scheduling.md): v0.19.2, the newest release the Go module proxy serves here
# (v0.18.2 and v0.19.0 too; v0.16.0, v0.17.1+ and v0.18.0 refused) and the newest tag of
# kubernetes-sigs/kueue read (v0.20.0-devel is main). Its end-to-end suites run on Kubernetes 1.34,
# 1.35 and 1.36 (README.md at the tag); 1.37 is not in them yet, though the release requires only
# "Kubernetes 1.29 or newer" (same README). Its objects are on v1beta2, the storage version of every
# CRD at the tag; v1beta1, still served there, is not served from v0.20. Its images are promoted to
# registry.k8s.io/kueue/kueue:<tag> (.github/ISSUE_TEMPLATE/NEW_RELEASE.md); scripts/build-kueue
# builds the same manager from the module for the kube tier.
KUEUE = Pin("registry.k8s.io/kueue/kueue:v0.19.2",
            "kubernetes-sigs/kueue README.md at v0.19.2: E2E baseline suites for Kubernetes 1.34, 1.35, 1.36")
# Its Helm chart, oci://registry.k8s.io/kueue/charts/kueue, is versioned as the tag without its "v";
# tests/infra/test_kueue_chart.py holds the two together.
KUEUE_CHART_VERSION = Pin("0.19.2", "kubernetes-sigs/kueue site/hugo.toml at v0.19.2 (chart_version); "
                          "charts/kueue/Chart.yaml version 0.19.2; the installation page's `helm install ... "
                          "--version` (site/content/en/docs/getting-started/installation.md)")
# The NVIDIA container toolkit on GPU hosts (the container_runtime role's default; a test keeps them
# equal). Its four packages share the version (packaging/debian/control).
NVIDIA_CONTAINER_TOOLKIT = Pin("1.20.2", "github.com/NVIDIA/nvidia-container-toolkit v1.20.2 (the Go module proxy's "
                               "newest; CHANGELOG.md): jit-cdi is the runtime's default mode from 1.18.0; "
                               "CVE-2025-23266 and -23267 fixed from 1.17.8 (NVIDIA bulletin a_id/5659). NVIDIA's "
                               "apt repository was not read: check that 1.20.2-1 is published on the site mirror")

# Approves kubelet serving-certificate requests; it supports the three newest Kubernetes minors and
# uses only the stable certificates.k8s.io/v1 API.
KUBELET_CSR_APPROVER = Pin("ghcr.io/postfinance/kubelet-csr-approver:v1.2.14",
                           "github.com/postfinance/kubelet-csr-approver tags (v1.2.14, 2026-04-09)")

SHARED: dict[str, Pin] = {
    "flannel": FLANNEL, "flannel_cni_plugin": FLANNEL_CNI_PLUGIN, "kube_network_policies": KUBE_NETWORK_POLICIES,
    "nvidia_device_plugin": NVIDIA_DEVICE_PLUGIN, "dcgm_exporter": DCGM_EXPORTER,
    "rdma_shared_device_plugin": RDMA_SHARED_DEVICE_PLUGIN, "prometheus": PROMETHEUS, "node_exporter": NODE_EXPORTER,
    "grafana": GRAFANA, "kueue": KUEUE, "kueue_chart": KUEUE_CHART_VERSION,
    "kubelet_csr_approver": KUBELET_CSR_APPROVER,
}

# pkgs.k8s.io's Debian revision of every Kubernetes release's packages (kubelet=1.31.4-1.1):
# the Open Build Service projects isv:kubernetes:core:stable:v1.x build each release as <version>-1.1.
K8S_DEB_REVISION = "1.1"

# Version skew (kubernetes.io/releases/version-skew-policy): a kubelet may trail the API server by
# this many minors (1.28 and later).
KUBELET_MAX_MINORS_BEHIND = 3


# --- Lookups ---------------------------------------------------------------------------------------


def key(version: str) -> tuple[int, ...]:
    """A version's numbers, for ordering ("1.7.27" -> (1, 7, 27)); a "v" and a "-0" suffix are ignored."""
    return tuple(int(part) for part in version.lstrip("v").split("-")[0].split("."))


def minor_of(version: str) -> str:
    """`1.31` of `1.31.4` (or of `v1.31.4`, or of `1.31`)."""
    return ".".join(version.strip().lstrip("v").split(".")[:2])


def row(version: str) -> Minor | None:
    """The catalog row of a Kubernetes version's minor, None if corral has none."""
    return MINORS.get(minor_of(version))


def known_minors() -> list[str]:
    return sorted(MINORS, key=key)


def per_minor(component: str) -> dict[str, str]:
    """{minor: value} of one per-minor component, for the minors where it has a value."""
    found = {}
    for minor, entry in MINORS.items():
        pin = getattr(entry, component)
        if isinstance(pin, Pin) and pin.value is not None:
            found[minor] = pin.value
    return found


def default_containerd(kubernetes: str) -> str:
    """The containerd a cluster of this Kubernetes version runs when its file names none: its
    row's default; for a minor without one, the newest supported minor's (the rules then say why
    it does not fit)."""
    entry = row(kubernetes)
    if entry is not None and entry.containerd_default is not None:
        return entry.containerd_default.value
    return DEFAULT_CONTAINERD


def default_containerd_text() -> str:
    """The per-minor defaults in words, newest first: "2.3.6 for 1.35 to 1.37; 1.7.27 for 1.26 to 1.33"."""
    runs: list[list] = []
    for minor in known_minors():
        pin = MINORS[minor].containerd_default
        value = pin.value if pin is not None else None
        if runs and runs[-1][0] == value and key(runs[-1][2]) == (key(minor)[0], key(minor)[1] - 1):
            runs[-1][2] = minor
        else:
            runs.append([value, minor, minor])
    return "; ".join(f"{value} for {low}" + (f" to {high}" if high != low else "")
                     for value, low, high in reversed(runs) if value is not None)


def release_problem(version: str) -> str | None:
    """Why `version` is not a Kubernetes release ("1.31.44": 1.31 ended at 1.31.14), or None.
    Only a minor whose last patch is known (patches_final) can refuse a patch: for the others a
    newer patch than corral has seen may well exist (upstream ships one about every month)."""
    entry = row(version)
    if entry is None or entry.latest_patch is None or not entry.patches_final:
        return None
    numbers = key(version)
    if len(numbers) < 3 or numbers[2] <= entry.latest_patch:
        return None
    return (f"{version} is not a Kubernetes release: {entry.minor} ended with "
            f"{entry.minor}.{entry.latest_patch} ({entry.patches_source})")


@dataclass(frozen=True)
class SupportProblem:
    """A minor past its end of life (refused) or close to it (warned)."""

    refused: bool
    message: str


def supported_successor(today: date) -> str | None:
    """The oldest minor corral supports that is still in support on `today`."""
    for minor in SUPPORTED_MINORS:
        if MINORS[minor].end_of_life >= today:
            return minor
    return None


def _upgrade_steps(minor: str, target: str) -> list[str]:
    major, start = key(minor)[:2]
    return [f"{major}.{m}" for m in range(start + 1, key(target)[1] + 1)]


def support_problem(version: str, today: date, cluster: str = "<cluster>") -> SupportProblem | None:
    """Whether Kubernetes `version` may be run on `today`: refused past its minor's end of life
    (with the date and the upgrade to make), warned EOL_WARNING before it, None otherwise.
    The clock is a parameter: a pin expires in CI the day its minor leaves support."""
    minor = minor_of(version)
    entry = MINORS.get(minor)
    if entry is None:
        return SupportProblem(True, f"corral knows Kubernetes {', '.join(known_minors())}, not {minor}; "
                                    "add its row to corral/model/versions.py")
    target = supported_successor(today)
    if entry.end_of_life < today:
        if target is None:
            return SupportProblem(True, f"Kubernetes {minor} reached its end of life on {entry.end_of_life}, "
                                        "and so has every minor corral knows: add the current ones to "
                                        "corral/model/versions.py")
        if key(target) <= key(minor):
            return SupportProblem(True, f"Kubernetes {minor} reached its end of life on {entry.end_of_life}")
        first, *rest = _upgrade_steps(minor, target)
        then = f", then to {', '.join(f'{step}.x' for step in rest)}" if rest else ""
        return SupportProblem(True, (
            f"Kubernetes {minor} reached its end of life on {entry.end_of_life}; upgrade to {target} or later: "
            f"corral upgrade {cluster} --to {first}.x{then} (one minor at a time: kubeadm skips none)"))
    left = (entry.end_of_life - today).days
    if entry.end_of_life - today <= EOL_WARNING:
        after = [m for m in SUPPORTED_MINORS if key(m) > key(minor) and MINORS[m].end_of_life > entry.end_of_life]
        plan = f"; plan the upgrade to {after[0]}: corral upgrade {cluster} --to {after[0]}.x" if after else ""
        return SupportProblem(False, f"Kubernetes {minor} reaches its end of life on {entry.end_of_life} "
                                     f"(in {left} days){plan}")
    return None


# The default containerd of the newest supported minor: what a new cluster runs.
DEFAULT_CONTAINERD = MINORS[SUPPORTED_MINORS[-1]].containerd_default.value
# A Kubernetes version for messages' examples: the newest patch of the newest supported minor.
EXAMPLE_VERSION = f"{SUPPORTED_MINORS[-1]}.{MINORS[SUPPORTED_MINORS[-1]].latest_patch}"


def _new_cluster_version() -> str:
    """The newest patch of the newest supported minor that has every add-on a cluster with cloud pools
    runs (a cluster-autoscaler): what `corral cluster new` writes when the fleet has no newer one."""
    for minor in reversed(SUPPORTED_MINORS):
        entry = MINORS[minor]
        if entry.cluster_autoscaler is not None and entry.cluster_autoscaler.value is not None:
            return f"{minor}.{entry.latest_patch}"
    return EXAMPLE_VERSION


NEW_CLUSTER_VERSION = _new_cluster_version()
