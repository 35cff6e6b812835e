"""`corral certs`: every certificate of a cluster with its expiry, and renewal.

Sources (`sources`): the Pulumi state's pulumi-tls certificates (CAs, etcd
member and client certificates, the break-glass admin), the serving
certificates the API servers and etcd members present on the network (a TLS
handshake; kubeadm issues the API servers' certificates on the machines, so
they are in no state), and the certificates on the on-prem nodes (read over
Ansible, certificate blocks only, never keys). `expiry` turns PEM into rows
and flags those within the warning window; `rules` is the alert for the same
window; `kubeconfig` issues short-lived operator credentials through the
CertificateSigningRequest API; `renew` picks the API servers whose kubeadm
certificates are due for `corral upgrade --renew-certs`; `machine` is the
API servers' own hourly job writing their kubeadm certificates' expiry for
the cluster's node-exporter. See docs/upgrades.md.
"""
