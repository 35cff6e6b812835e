"""On-prem nodes: the Ansible inventory built from a cluster, and `corral join`."""
