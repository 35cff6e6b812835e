"""The Pulumi program that stands up a cluster's control plane and cloud pools.

`corral/infra/program.py` is what `pulumi up` runs (see Pulumi.yaml); each
cloud is one package (`azure/`, `aws/`, `gcp/`) exporting the same
components with the same inputs (see `platform.py`), Typhoon style.
"""
