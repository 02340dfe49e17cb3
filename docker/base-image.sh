#!/usr/bin/env bash
# A base image made from Debian packages alone (debootstrap + docker import), for machines that cannot pull
# from public registries: Debian bookworm (minbase) with Python 3.11, venv and CA certificates. The compose
# file's images build on it when BASE_IMAGE names it (docker/compose-local.sh does).
#
#   docker/base-image.sh [TAG]        default TAG: elastic-local/debian-python:bookworm
#
# Needs root and debootstrap; the mirror is DEBIAN_MIRROR (default: the first deb.debian.org-like URI of
# this machine's apt sources, else http://deb.debian.org/debian). Takes about a minute and a half.
set -euo pipefail
TAG=${1:-elastic-local/debian-python:bookworm}
if docker image inspect "$TAG" >/dev/null 2>&1; then echo "base image $TAG: present"; exit 0; fi
MIRROR=${DEBIAN_MIRROR:-$(grep -rhoE '^(URIs:|deb) +https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list* 2>/dev/null |
  awk '{print $2}' | head -n 1)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
ROOT=$(mktemp -d /tmp/elastic-rootfs.XXXXXX)
trap 'rm -rf "$ROOT"' EXIT
start=$(date +%s)
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$ROOT" "$MIRROR" \
  >"$ROOT.log" 2>&1 || { tail -n 20 "$ROOT.log"; exit 1; }
rm -f "$ROOT.log"
rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/cache/apt/*.bin "$ROOT"/var/cache/apt/archives/*.deb
echo "deb $MIRROR bookworm main" >"$ROOT/etc/apt/sources.list"
tar -C "$ROOT" -c . | docker import --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' - "$TAG" >/dev/null
echo "base image $TAG: built from $MIRROR in $(( $(date +%s) - start )) s"
