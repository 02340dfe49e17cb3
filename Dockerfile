# One image for the controller, the agents (elastic-agent = torchrun with the etcd-v3 rendezvous) and the
# example training script:  docker build -t ghcr.io/elastic-etcd/elastic:0.1.0 .
#
# Builds anywhere (docker/README.md):
#   BASE_IMAGE   the Python 3.10+ image to start from (default python:3.11-slim; docker/base-image.sh makes
#                one from Debian packages alone, for machines that cannot pull from public registries)
#   docker/wheelhouse/   wheels the host filled with its own pip configuration (docker/wheelhouse.sh): when
#                it holds any, everything is installed from it and no index is reached from inside the build;
#                when empty, torch comes from TORCH_INDEX (CPU-only) and the rest from PyPI
#   docker/ca/*.crt      extra CA certificates (an intercepting proxy's) added to the image's trust store
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH
COPY docker/ca/ /usr/local/share/ca-certificates/extra/
RUN if ls /usr/local/share/ca-certificates/extra/*.crt >/dev/null 2>&1; then update-ca-certificates; fi

# The virtualenv is built in a stage of its own, so the wheelhouse never becomes a layer of the image.
FROM base AS build
# torch first: the biggest layer, and one that code changes do not invalidate. PyPI's default torch wheel
# pulls in CUDA (GBs), so without a wheelhouse it comes from the CPU-only index.
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
COPY docker/wheelhouse/ /wheelhouse/
RUN python3 -m venv /opt/venv \
    && if ls /wheelhouse/*.whl >/dev/null 2>&1; then from="--no-index --find-links /wheelhouse"; \
    else from="--index-url ${TORCH_INDEX}"; fi \
    && pip install $from "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY elastic ./elastic
RUN if ls /wheelhouse/*.whl >/dev/null 2>&1; then from="--no-index --find-links /wheelhouse"; else from=""; fi \
    && pip install $from .

FROM base
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
COPY examples ./examples

# A numeric non-root user, so Kubernetes can check `runAsNonRoot` (controller.yaml runs as 10001).
# /checkpoints belongs to it, so a fresh named volume mounted there (docker-compose.yml) is writable.
RUN groupadd --gid 10001 elastic \
    && useradd --uid 10001 --gid 10001 --home-dir /home/elastic --create-home --shell /usr/sbin/nologin elastic \
    && mkdir /checkpoints \
    && chown 10001:10001 /checkpoints
USER 10001:10001

CMD ["elastic", "--help"]
