"""corral's one SigV4 signer (corral/machine/sigv4.py) where corral is not installed: the cloud
client's pods get cloud_api.py and sigv4.py side by side in their ConfigMap
(corral/manifests/api_server_host.py cloud_api_files), and cloud_api.py must import its signer from
there. Run as the pod runs them: a script in a folder holding only those files, by the system's
python3 (Debian's, where corral is not installed; -s -E: no user site, no PYTHON* variables).
"""

from __future__ import annotations

import shutil
import subprocess

from corral.health import cloud_api
from corral.manifests import api_server_host

PROBE = """
import cloud_api, sigv4
signed = cloud_api.sigv4_authorization(
    "POST", "/", "", [("Host", "ec2.us-west-2.amazonaws.com"), ("X-Amz-Date", "20260101T000000Z")], b"x",
    access_key="AKIAFAKE", secret_key="fake-secret", region="us-west-2", service="ec2",
    amz_date="20260101T000000Z")
assert cloud_api.sigv4_authorization is sigv4.sigv4_authorization
print(signed.authorization)
"""


def test_the_shipped_cloud_client_signs_with_the_sigv4_file_beside_it(tmp_path):
    files = api_server_host.cloud_api_files()
    assert set(files) == {"cloud_api.py", "sigv4.py"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "probe.py").write_text(PROBE)
    python = shutil.which("python3", path="/usr/bin")
    assert python, "the system python3 (the machines' and pods' interpreter) is needed here"
    assert subprocess.run([python, "-s", "-E", "-c", "import corral"], check=False, capture_output=True,
                          cwd=tmp_path).returncode != 0
    done = subprocess.run([python, "-s", "-E", str(tmp_path / "probe.py")], check=False, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    expected = cloud_api.sigv4_authorization(
        "POST", "/", "", [("Host", "ec2.us-west-2.amazonaws.com"), ("X-Amz-Date", "20260101T000000Z")], b"x",
        access_key="AKIAFAKE", secret_key="fake-secret", region="us-west-2", service="ec2",
        amz_date="20260101T000000Z").authorization
    assert done.stdout.strip() == expected
