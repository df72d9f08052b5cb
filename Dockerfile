# One image for both pobo services (curator and modeler): `pobo curator serve` / `pobo modeler serve`.
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY curator_service ./curator_service
COPY modeler_service ./modeler_service
COPY migrations ./migrations
RUN python -m venv /opt/pobo && /opt/pobo/bin/pip install --upgrade pip && /opt/pobo/bin/pip install /src

FROM python:3.11-slim
ENV PATH=/opt/pobo/bin:$PATH PYTHONUNBUFFERED=1 MPLBACKEND=Agg
RUN groupadd --system pobo && useradd --system --gid pobo --home-dir /data --create-home pobo
COPY --from=build /opt/pobo /opt/pobo
COPY --chown=pobo:pobo migrations /app/migrations
WORKDIR /data
USER pobo
EXPOSE 8001 8002
HEALTHCHECK --interval=10s --timeout=3s --retries=5 CMD python -c "import os,urllib.request,sys; p=os.environ.get('POBO_HEALTH_PORT','8001'); sys.exit(0 if urllib.request.urlopen(f'http://127.0.0.1:{p}/healthz').status==200 else 1)"
CMD ["pobo", "--help"]
