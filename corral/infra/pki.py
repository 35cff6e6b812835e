"""The cluster's PKI, issued by Pulumi before any machine exists.

Certificate authorities (Kubernetes, etcd, front proxy), the service-account
key pair, etcd member certificates (their addresses come from the layout, so
they can be issued up front), the API servers' etcd client certificate, the
admin's client certificate, the bootstrap token and the VPN pre-shared keys.

Every private key is a Pulumi secret: pulumi-tls marks `private_key_pem`
secret itself, and everything corral derives from keys (`key_pem`, the
token, the PSKs) is wrapped in `Output.secret`. kubeadm issues the API
servers' own serving and kubelet-client certificates from the CA keys.

Keys are RSA 2048, as kubeadm's defaults, so every consumer (kubeadm, etcd,
VPN appliances, older kubectl) takes them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import pulumi
import pulumi_random as random
import pulumi_tls as tls
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from .platform import ClusterContext

KEY_ALGORITHM = "RSA"
RSA_BITS = 2048
CA_VALIDITY_HOURS = 10 * 365 * 24
# Member and client certificates: issued once and baked into the machines'
# cloud-init, so they live long; `pulumi up` re-issues them inside the early
# renewal window (the machines then need re-provisioning, one at a time).
LEAF_VALIDITY_HOURS = 3 * 365 * 24
LEAF_EARLY_RENEWAL_HOURS = 90 * 24
ADMIN_VALIDITY_HOURS = 365 * 24
ADMIN_EARLY_RENEWAL_HOURS = 30 * 24

CA_USES = ["cert_signing", "crl_signing", "digital_signature", "key_encipherment"]
SERVER_USES = ["digital_signature", "key_encipherment", "server_auth"]
CLIENT_USES = ["digital_signature", "key_encipherment", "client_auth"]
# etcd members dial each other with the peer certificate, and etcd's gRPC
# gateway dials the member itself with the server certificate: both ways.
PEER_USES = ["digital_signature", "key_encipherment", "server_auth", "client_auth"]

# kubeadm's bootstrap token: `[a-z0-9]{6}.[a-z0-9]{16}`.
TOKEN_ID_LENGTH = 6
TOKEN_SECRET_LENGTH = 16
# Letters only: AWS refuses pre-shared keys that start with "0", and 48
# letters are ~270 bits, far beyond what IKE needs.
PSK_LENGTH = 48
# secretbox takes a 32-byte key.
ENCRYPTION_KEY_BYTES = 32


def ca_cert_hash(cert_pem: str) -> str:
    """kubeadm's discovery hash: `sha256:` + hex SHA-256 of the CA's SubjectPublicKeyInfo (DER)."""
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    spki = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return "sha256:" + hashlib.sha256(spki).hexdigest()


class KeyAndCert:
    """A private key (always handed out as a secret) and its certificate."""

    key: tls.PrivateKey
    cert: tls.SelfSignedCert | tls.LocallySignedCert

    @property
    def cert_pem(self) -> pulumi.Output[str]:
        return self.cert.cert_pem

    @property
    def key_pem(self) -> pulumi.Output[str]:
        return pulumi.Output.secret(self.key.private_key_pem)


class CertificateAuthority(KeyAndCert):
    """A self-signed CA: its key and certificate."""

    def __init__(self, name: str, common_name: str, parent: pulumi.Resource):
        opts = pulumi.ResourceOptions(parent=parent)
        self.key = tls.PrivateKey(f"{name}-key", algorithm=KEY_ALGORITHM, rsa_bits=RSA_BITS, opts=opts)
        self.cert = tls.SelfSignedCert(
            name,
            private_key_pem=self.key.private_key_pem,
            subject=tls.SelfSignedCertSubjectArgs(common_name=common_name),
            is_ca_certificate=True,
            validity_period_hours=CA_VALIDITY_HOURS,
            allowed_uses=CA_USES,
            set_subject_key_id=True,
            opts=opts,
        )


class IssuedCert(KeyAndCert):
    """A key, its certificate request and the certificate a CA signed for it."""

    def __init__(
        self,
        name: str,
        ca: CertificateAuthority,
        parent: pulumi.Resource,
        *,
        common_name: str,
        uses: list[str],
        organization: str | None = None,
        dns_names: list[str] | None = None,
        ip_addresses: list[str] | None = None,
        validity_hours: int = LEAF_VALIDITY_HOURS,
        early_renewal_hours: int = LEAF_EARLY_RENEWAL_HOURS,
    ):
        opts = pulumi.ResourceOptions(parent=parent)
        self.key = tls.PrivateKey(f"{name}-key", algorithm=KEY_ALGORITHM, rsa_bits=RSA_BITS, opts=opts)
        self.request = tls.CertRequest(
            f"{name}-csr",
            private_key_pem=self.key.private_key_pem,
            subject=tls.CertRequestSubjectArgs(common_name=common_name, organization=organization),
            dns_names=dns_names,
            ip_addresses=ip_addresses,
            opts=opts,
        )
        self.cert = tls.LocallySignedCert(
            name,
            cert_request_pem=self.request.cert_request_pem,
            ca_cert_pem=ca.cert.cert_pem,
            ca_private_key_pem=ca.key.private_key_pem,
            validity_period_hours=validity_hours,
            early_renewal_hours=early_renewal_hours,
            allowed_uses=uses,
            opts=opts,
        )


@dataclass
class EtcdMemberCerts:
    server: IssuedCert
    peer: IssuedCert


def token_rotation() -> str:
    """`corral:bootstrapTokenRotation` (stack config): change it to issue new bootstrap tokens."""
    return pulumi.Config("corral").get("bootstrapTokenRotation") or "initial"


class Pki(pulumi.ComponentResource):
    """The cluster's CAs, keys, certificates, bootstrap token and VPN keys.

    Attributes:
        kubernetes_ca, etcd_ca, front_proxy_ca   CertificateAuthority
        service_account_key                       tls.PrivateKey
        etcd_members                              member name -> EtcdMemberCerts
                                                  (etcd and events-etcd members)
        apiserver_etcd_client, admin              IssuedCert
        bootstrap_token                           secret Output "[a-z0-9]{6}.[a-z0-9]{16}" (API servers)
        pool_tokens                               cloud pool name -> its own token (secret)
        init_token                                kubeadm init's own (unused, 1 h)
        encryption_key                            secret Output: 32 random bytes, base64
        ca_cert_hash                              Output "sha256:<hex>"
        vpn_shared_keys                           site name -> secret Output
    """

    def __init__(self, name: str, ctx: ClusterContext, opts: pulumi.ResourceOptions | None = None):
        super().__init__("corral:infra:Pki", name, None, opts)
        cluster, lay = ctx.cluster, ctx.layout

        self.kubernetes_ca = CertificateAuthority("kubernetes-ca", "kubernetes", self)
        self.etcd_ca = CertificateAuthority("etcd-ca", "etcd-ca", self)
        self.front_proxy_ca = CertificateAuthority("front-proxy-ca", "front-proxy-ca", self)
        self.service_account_key = tls.PrivateKey(
            "service-account-key", algorithm=KEY_ALGORITHM, rsa_bits=RSA_BITS,
            opts=pulumi.ResourceOptions(parent=self),
        )

        self.etcd_members: dict[str, EtcdMemberCerts] = {}
        for member in (*lay.etcd_members, *lay.events_members):
            names = [member.name, "localhost"]
            addresses = [member.ip, "127.0.0.1"]
            self.etcd_members[member.name] = EtcdMemberCerts(
                server=IssuedCert(
                    f"etcd-server-{member.name}", self.etcd_ca, self, common_name=member.name,
                    uses=PEER_USES, dns_names=names, ip_addresses=addresses,
                ),
                peer=IssuedCert(
                    f"etcd-peer-{member.name}", self.etcd_ca, self, common_name=member.name,
                    uses=PEER_USES, dns_names=[member.name], ip_addresses=[member.ip],
                ),
            )
        self.apiserver_etcd_client = IssuedCert(
            "apiserver-etcd-client", self.etcd_ca, self,
            common_name="kube-apiserver-etcd-client", uses=CLIENT_USES,
        )
        # system:masters: the admin kubeconfig works even if RBAC is broken.
        self.admin = IssuedCert(
            "kubernetes-admin", self.kubernetes_ca, self,
            common_name="kubernetes-admin", organization="system:masters", uses=CLIENT_USES,
            validity_hours=ADMIN_VALIDITY_HOURS, early_renewal_hours=ADMIN_EARLY_RENEWAL_HOURS,
        )

        # Bootstrap tokens expire (bootstrap.token_ttl_hours) and are replaced
        # together whenever `corral:bootstrapTokenRotation` changes (any
        # string: a date is a good one): `random` keepers make new values.
        rotation = token_rotation()
        self.bootstrap_token: pulumi.Output[str] = self._token("bootstrap-token", rotation)
        # `kubeadm init` generates a token of its own when given none; this one
        # stands in for it, lives an hour, and nothing joins with it. Every
        # token that machines join with is registered by Pulumi (addons.py).
        self.init_token: pulumi.Output[str] = self._token("bootstrap-token-init", rotation)
        # One token per cloud pool: a pool's machines can read only their own
        # (in the secret store), and a pool's token is revoked on its own.
        self.pool_tokens: dict[str, pulumi.Output[str]] = {
            pool.name: self._token(f"bootstrap-token-{pool.name}", rotation) for pool in cluster.cloud_pools
        }
        # The API servers' Secrets encryption key (EncryptionConfiguration, secretbox).
        self.encryption_key: pulumi.Output[str] = pulumi.Output.secret(random.RandomBytes(
            "secrets-encryption-key", length=ENCRYPTION_KEY_BYTES, opts=pulumi.ResourceOptions(parent=self),
        ).base64)
        self.ca_cert_hash: pulumi.Output[str] = self.kubernetes_ca.cert_pem.apply(ca_cert_hash)

        self.vpn_shared_keys: dict[str, pulumi.Output[str]] = {}
        for site in cluster.sites:
            if site.vpn is None:
                continue
            psk = random.RandomPassword(
                f"vpn-psk-{site.name}", length=PSK_LENGTH, numeric=False, special=False,
                opts=pulumi.ResourceOptions(parent=self),
            )
            self.vpn_shared_keys[site.name] = pulumi.Output.secret(psk.result)

        self.register_outputs({
            "kubernetesCaCert": self.kubernetes_ca.cert_pem,
            "caCertHash": self.ca_cert_hash,
        })

    def _token(self, name: str, rotation: str) -> pulumi.Output[str]:
        """A kubeadm bootstrap token `[a-z0-9]{6}.[a-z0-9]{16}`, new whenever `rotation` changes."""
        opts = pulumi.ResourceOptions(parent=self)
        keepers = {"rotation": rotation}
        token_id = random.RandomPassword(
            f"{name}-id", length=TOKEN_ID_LENGTH, upper=False, special=False, keepers=keepers, opts=opts,
        )
        token_secret = random.RandomPassword(
            f"{name}-secret", length=TOKEN_SECRET_LENGTH, upper=False, special=False, keepers=keepers, opts=opts,
        )
        return pulumi.Output.secret(pulumi.Output.concat(token_id.result, ".", token_secret.result))
