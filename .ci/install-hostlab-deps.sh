#!/usr/bin/env bash
# Install the Debian packages the throwaway test-host lab (tests/hostlab/) needs.
#
# Idempotent: packages already present are not reinstalled and apt-get update
# runs only when something is missing.  Safe to call from .ci/run on every run.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

# debootstrap          - builds the cached Debian bookworm base root
# systemd-container    - systemd-nspawn, which boots each test host
# iptables             - NAT (MASQUERADE) so hosts reach the Debian mirror
# iproute2             - bridge / address management
# bridge-utils         - brctl, handy when debugging the lab bridge
# openssh-client       - ssh/ssh-keygen to reach the hosts
# apt-utils            - apt-ftparchive, indexes the local signed apt repo
# gnupg                - signs the local apt repo (InRelease)
# zstd                 - compression of the cached base tarball
# (dpkg-deb, mount and setsid come with dpkg and util-linux, always present)
PKGS=(debootstrap systemd-container iptables iproute2 bridge-utils openssh-client
      apt-utils gnupg zstd)

missing=()
for p in "${PKGS[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
        missing+=("$p")
    fi
done

if [ "${#missing[@]}" -eq 0 ]; then
    echo "hostlab deps: all present"
    exit 0
fi

echo "hostlab deps: installing ${missing[*]}"
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
