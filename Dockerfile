# mcp-sidecar: a reverse proxy that gives MCP resource subscriptions to servers that lack them.
#
# An HTTP upstream:   docker run -p 8080:8080 -e MCP_SIDECAR__UPSTREAM__URL=http://legacy:9000/mcp mcp-sidecar
# The configuration is /etc/mcp-sidecar/config.yaml (config/container.yaml: every interface, ports 8080 and 9464;
# MCP_SIDECAR_CONFIG names it). A file mounted there replaces it whole; MCP_SIDECAR__* variables win over the
# file, and flags to `run` over both. The HEALTHCHECK (`mcp-sidecar health`) reads the same file and variables,
# not run's flags: set the listeners in the file or the environment.
# A stdio upstream runs in this container, so build on this image with the server installed and name its command:
#   FROM mcp-sidecar
#   USER root
#   RUN pip install --no-cache-dir mcp-server-time==2026.10.19
#   USER 10001
#   ENV MCP_SIDECAR__UPSTREAM__COMMAND="python -m mcp_server_time"
# (or `... run --upstream "python -m mcp_server_time"`). The entrypoint's tini reaps what the server's own children
# leave behind, with no `--init` from the runtime (a Kubernetes pod has none).
# CI builds the recipe's indented lines as written, on this image (.ci/build-image), and runs both (tests/image).
# With Podman or buildah, build with `--format docker`: the OCI format has no HEALTHCHECK, and it is dropped.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MCP_SIDECAR_CONFIG=/etc/mcp-sidecar/config.yaml

# tini, Debian's, at the version of the base image's release: it passes signals on to the sidecar and reaps
# orphaned processes, as PID 1 or (-s, a subreaper) below another init, as in a pod sharing its process namespace.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin sidecar

WORKDIR /opt/mcp-sidecar
# The dependencies first, in a layer of their own, at the versions constraints.txt pins (`bash .ci/lock` writes
# it): a change to the code alone installs none of them again.
COPY pyproject.toml constraints.txt ./
RUN python -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"], sep="\n")' \
        >dependencies.txt \
    && pip install --no-cache-dir -c constraints.txt -r dependencies.txt \
    && rm dependencies.txt
COPY README.md ./
COPY sidecar ./sidecar
RUN pip install --no-cache-dir -c constraints.txt .
COPY config/container.yaml /etc/mcp-sidecar/config.yaml

USER 10001
EXPOSE 8080 9464
HEALTHCHECK --interval=15s --timeout=10s --start-period=10s --retries=3 CMD ["mcp-sidecar", "health"]
ENTRYPOINT ["tini", "-s", "--", "mcp-sidecar"]
CMD ["run"]
