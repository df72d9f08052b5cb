# One image for both pobo services: `pobo curator serve` and `pobo modeler serve` (see compose.yaml).
FROM python:3.11-slim
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 MPLBACKEND=Agg \
    PATH=/opt/pobo/bin:$PATH
# A fixed uid/gid (10001), so the host files compose bind-mounts as secrets (docs/deployment.md,
# "docker compose") can be given to exactly this user: chown 10001:10001, mode 0600.
RUN groupadd --system --gid 10001 pobo \
    && useradd --system --uid 10001 --gid pobo --home-dir /data --create-home pobo
# The data directories compose mounts its named volumes on. A named volume mounted on an existing image
# directory takes over that directory's owner and mode on first use; on a missing one Docker creates the
# mount point owned by root, and the services (running as pobo) cannot write their data.
RUN mkdir -p /data/curator /data/modeler \
    && chown pobo:pobo /data/curator /data/modeler \
    && chmod 0700 /data/curator /data/modeler
WORKDIR /app
# The services find their alembic environments at <source>/migrations, so the source tree stays in /app.
# constraints.txt pins every run-time dependency, transitive ones too, at the versions the tests ran with
# (regenerate with `make lock`): a rebuild installs the same packages, not whatever is newest that day.
COPY pyproject.toml README.md constraints.txt ./
COPY shared ./shared
COPY curator_service ./curator_service
COPY modeler_service ./modeler_service
COPY pobo ./pobo
COPY migrations ./migrations
RUN python -m venv /opt/pobo \
    && /opt/pobo/bin/pip install --upgrade pip \
    && /opt/pobo/bin/pip install -c /app/constraints.txt -e /app
WORKDIR /data
USER pobo
EXPOSE 8001 8002
HEALTHCHECK --interval=10s --timeout=3s --retries=5 \
  CMD python -c "import os,sys,urllib.request; p=os.environ.get('POBO_HEALTH_PORT','8001'); sys.exit(0 if urllib.request.urlopen(f'http://127.0.0.1:{p}/healthz').status == 200 else 1)"
CMD ["pobo", "--help"]
