# mcp-sidecar: a reverse proxy that gives MCP resource subscriptions to servers that lack them.
#
# An HTTP upstream:   docker run -p 8080:8080 -e MCP_SIDECAR__UPSTREAM__URL=http://legacy:9000/mcp mcp-sidecar
# A stdio upstream runs in this container, so build on this image with the server installed and name its command:
#   FROM mcp-sidecar
#   USER root
#   RUN pip install --no-cache-dir mcp-server-time==2026.10.19
#   USER 10001
#   ENV MCP_SIDECAR__UPSTREAM__COMMAND="python -m mcp_server_time"
# (or `... run --config /etc/mcp-sidecar/sidecar.yaml --upstream "python -m mcp_server_time"`), and run it with
# `docker run --init`: the sidecar ends its child's whole process group, but as PID 1 it reaps no orphan.
# CI builds the recipe's indented lines as written, on this image (.ci/build-image), and runs both (tests/image).
# With Podman or buildah, build with `--format docker`: the OCI format has no HEALTHCHECK, and it is dropped.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    # Inside a container the sidecar must listen on every interface; loopback-only checks then step aside.
    MCP_SIDECAR__LISTEN__HOST=0.0.0.0 \
    # The admin listener (/metrics, /status) on 9464 for a scraper beside the container; do not publish it.
    MCP_SIDECAR__ADMIN__HOST=0.0.0.0

RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin sidecar

WORKDIR /opt/mcp-sidecar
COPY pyproject.toml README.md ./
COPY sidecar ./sidecar
# The package installed is this checkout; its dependency ranges live in pyproject.toml.
# hadolint ignore=DL3013
RUN pip install --no-cache-dir .
COPY config/sidecar.example.yaml /etc/mcp-sidecar/sidecar.yaml

USER 10001
EXPOSE 8080 9464
# The check asks the port MCP_SIDECAR__LISTEN__PORT names (8080 when unset), over loopback.
HEALTHCHECK --interval=15s --timeout=3s --start-period=5s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; port = os.environ.get('MCP_SIDECAR__LISTEN__PORT', '8080'); urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=2)"]
ENTRYPOINT ["mcp-sidecar"]
CMD ["run", "--config", "/etc/mcp-sidecar/sidecar.yaml"]
