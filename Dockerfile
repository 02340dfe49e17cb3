# One image for the controller, the agents (elastic-agent = torchrun with the etcd-v3 rendezvous) and the
# example training script:  docker build -t ghcr.io/elastic-etcd/elastic:0.1.0 .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# torch first, from the CPU-only index (PyPI's default wheel pulls in CUDA): the biggest layer, and one
# that code changes do not invalidate. The package's own `torch>=2.6` is then already satisfied.
ARG TORCH_VERSION=2.13.0
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_VERSION}"

WORKDIR /app
COPY pyproject.toml README.md ./
COPY elastic ./elastic
RUN pip install . && rm -rf build ./*.egg-info
COPY examples ./examples

# A numeric non-root user, so Kubernetes can check `runAsNonRoot` (controller.yaml runs as 10001).
# /checkpoints belongs to it, so a fresh named volume mounted there (docker-compose.yml) is writable.
RUN groupadd --gid 10001 elastic \
    && useradd --uid 10001 --gid 10001 --home-dir /home/elastic --create-home --shell /usr/sbin/nologin elastic \
    && mkdir /checkpoints \
    && chown 10001:10001 /checkpoints
USER 10001:10001

CMD ["elastic", "--help"]
