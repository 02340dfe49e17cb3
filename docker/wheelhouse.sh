#!/usr/bin/env bash
# Fills docker/wheelhouse/ with every wheel the image needs (torch, this project's dependencies, setuptools
# to build it), resolved by this machine's own pip configuration: its index, its proxy and CA settings, its
# local wheel folders. The image build then installs from the folder and reaches no index itself.
#
#   docker/wheelhouse.sh [PYTHON]     default PYTHON: .venv/bin/python if present, else python3
#
# The wheels must suit the image's Python (3.11 for both python:3.11-slim and Debian bookworm): PYTHON
# should be a 3.11 on linux x86_64/aarch64 like the image.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
TORCH=${TORCH:-torch==2.13.0}
version=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
[ "$version" = 3.11 ] || echo "warning: $PY is Python $version; the images run 3.11, whose wheels may differ"
start=$(date +%s)
log=$(mktemp)
"$PY" -m pip download --quiet --dest docker/wheelhouse "$TORCH" . "setuptools>=68" wheel 2>"$log" ||
  { grep -v "is ignored" "$log"; rm -f "$log"; exit 1; }
rm -f "$log"
rm -f docker/wheelhouse/elastic_etcd-*  # the project itself is copied into the image, not installed from here
echo "wheelhouse: $(ls docker/wheelhouse/*.whl | wc -l) wheels, $(du -sh docker/wheelhouse | cut -f1), in $(( $(date +%s) - start )) s"
