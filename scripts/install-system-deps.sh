#!/usr/bin/env bash
# Installs the system packages vkgraph needs through apt-get when run as root; otherwise names
# what is missing and fails. Usage: scripts/install-system-deps.sh [PYTHON]
set -euo pipefail
python=${1:-python3}
pkgs=(libvulkan1 mesa-vulkan-drivers glslang-tools vulkan-validationlayers)
missing=()

if command -v dpkg-query >/dev/null 2>&1; then
    for p in "${pkgs[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    # Debian's own python3 has no ensurepip (so no `-m venv`) without python3-venv.
    "$python" -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
else
    # Not a Debian system: check for the things themselves.
    command -v glslangValidator >/dev/null 2>&1 || missing+=(glslang-tools)
    ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1' || missing+=(libvulkan1)
fi

[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing system packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
    echo "vkgraph needs these system packages, which are missing: ${missing[*]}" >&2
    echo "install them as root, e.g.: sudo apt-get install ${missing[*]}" >&2
    exit 1
fi
