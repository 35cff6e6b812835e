"""Alerts for certificates with less than `WARN_DAYS` left, tested with promtool.

Three sources, so every certificate corral lists is covered:
* `corral_certificate_expiry_timestamp_seconds{source, where, subject}`: what
  `corral certs CLUSTER --metrics FILE` writes (node-exporter's textfile
  collector, or any file Prometheus scrapes): the state's, the API servers'
  and etcd members' presented, and the on-prem nodes' certificates; and,
  source="machine", what each API server's hourly job (machine.py) writes
  for the cluster's node-exporter: kubeadm's certificates on it;
* `kubelet_certificate_manager_client_ttl_seconds` /
  `kubelet_certificate_manager_server_ttl_seconds`: each kubelet's own
  (rotation should keep them far from zero; when it stops, they run down);
* `apiserver_client_certificate_expiration_seconds`: client certificates
  presented to the API servers (an admin or component credential in use).
"""

from __future__ import annotations

from corral.machine.cert_expiry import EXPIRY_METRIC

from .expiry import WARN_DAYS

WINDOW_SECONDS = WARN_DAYS * 86400


def rule_groups(warn_days: int = WARN_DAYS) -> list[dict]:
    window = warn_days * 86400
    runbook = "docs/upgrades.md#certificates"
    return [{
        "name": "corral-certificates",
        "rules": [
            {
                "alert": "CertificateExpiringSoon",
                # Expired ones are CertificateExpired's (one alert per state).
                "expr": f"({EXPIRY_METRIC} - time() < {window}) >= 0",
                "labels": {"severity": "warning"},
                "annotations": {
                    "summary": "Certificate {{ $labels.subject }} ({{ $labels.where }}) expires in "
                               "{{ $value | humanizeDuration }}",
                    "description": f"Less than {warn_days} days left. Renew it (`corral certs`), see {runbook}.",
                },
            },
            {
                "alert": "CertificateExpired",
                "expr": f"{EXPIRY_METRIC} - time() < 0",
                "labels": {"severity": "critical"},
                "annotations": {"summary": "Certificate {{ $labels.subject }} ({{ $labels.where }}) has expired",
                                "description": f"See {runbook}."},
            },
            {
                "alert": "KubeletCertificateExpiringSoon",
                "expr": (f"min by (node) (kubelet_certificate_manager_client_ttl_seconds) < {window} or "
                         f"min by (node) (kubelet_certificate_manager_server_ttl_seconds) < {window}"),
                "for": "1h",
                "labels": {"severity": "warning"},
                "annotations": {"summary": "A kubelet certificate on {{ $labels.node }} expires in "
                                           "{{ $value | humanizeDuration }}: its rotation is not working",
                                "description": f"See {runbook}."},
            },
            {
                "alert": "ClientCertificateExpiringSoon",
                "expr": ("histogram_quantile(0.01, sum by (job, le) "
                         f"(rate(apiserver_client_certificate_expiration_seconds_bucket[5m]))) < {window}"),
                "for": "1h",
                "labels": {"severity": "warning"},
                "annotations": {"summary": "Clients present certificates to the API servers that expire within "
                                           f"{warn_days} days",
                                "description": f"See {runbook}."},
            },
        ],
    }]


def metrics_text(records) -> str:
    """The records in Prometheus' text format (one gauge sample each)."""
    def quoted(value: str) -> str:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')

    lines = [f"# HELP {EXPIRY_METRIC} When the certificate expires (notAfter), as a Unix time.",
             f"# TYPE {EXPIRY_METRIC} gauge"]
    for r in records:
        lines.append(f'{EXPIRY_METRIC}{{source="{quoted(r.source)}",where="{quoted(r.where)}",'
                     f'subject="{quoted(r.subject)}"}} {int(r.not_after.timestamp())}')
    return "\n".join(lines) + "\n"
