#!/usr/bin/env bash
# Everything the compose cluster needs, made on this machine, for one that cannot pull from public registries:
# a Debian base image (docker/base-image.sh), an etcd image from Debian's package (docker/etcd/Dockerfile)
# and the wheelhouse (docker/wheelhouse.sh). Prints the variables the compose file reads, for `eval`:
#
#   eval "$(docker/local-images.sh)"
#   docker-compose up --build --scale worker=3
#
# Needs root and debootstrap for the base image; progress goes to stderr. About two minutes the first time.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${BASE_IMAGE_TAG:-elastic-local/debian-python:bookworm}
ETCD=${ETCD_IMAGE_TAG:-elastic-local/etcd:3.4-debian}
docker/base-image.sh "$BASE" >&2
if ! docker image inspect "$ETCD" >/dev/null 2>&1; then
  start=$(date +%s)
  docker build --quiet --build-arg BASE_IMAGE="$BASE" -t "$ETCD" docker/etcd >/tmp/elastic-etcd-image.log 2>&1 ||
    { tail -n 20 /tmp/elastic-etcd-image.log >&2; exit 1; }
  echo "etcd image $ETCD: built from Debian's etcd-server in $(( $(date +%s) - start )) s" >&2
else
  echo "etcd image $ETCD: present" >&2
fi
ls docker/wheelhouse/torch-*.whl >/dev/null 2>&1 || docker/wheelhouse.sh >&2
echo "export BASE_IMAGE=$BASE ETCD_IMAGE=$ETCD"
