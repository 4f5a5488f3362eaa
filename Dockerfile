# One image for every TAS-MoE Lab process: the six services (`tasmoe serve <name>`), the Celery worker and the
# migration job differ only by their command (see docker-compose.yml and deploy/k8s/).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PROJECT_ENVIRONMENT=/app/.venv

# uv, pinned to the version the Makefile uses
COPY --from=ghcr.io/astral-sh/uv:0.13.9 /uv /uvx /usr/local/bin/

WORKDIR /app

# Dependencies first (cached while only the code changes), exactly as locked, without the dev group.
COPY pyproject.toml uv.lock README.md ./
RUN uv sync --frozen --no-dev --no-install-project

COPY shared ./shared
COPY services ./services
COPY scripts ./scripts
COPY configs ./configs
RUN uv sync --frozen --no-dev

# The thermal kernels (numba) compiled once at build time into a cache every container reads.
ENV NUMBA_CACHE_DIR=/app/.numba-cache
RUN /app/.venv/bin/python -m services.thermal.spectral_kernels && /app/.venv/bin/python -m services.thermal.exp_kernels \
    && /app/.venv/bin/python -m services.thermal.window_kernels

# Non-root runtime user; results/ and the API key folder (a volume in docker-compose.yml) are where processes write.
RUN useradd --create-home --uid 10001 --user-group tasmoe \
    && mkdir -p /app/results /app/keys \
    && chown tasmoe:tasmoe /app/results /app/keys
USER tasmoe

ENV PATH="/app/.venv/bin:${PATH}" \
    TASMOE_MODE=cluster \
    TASMOE_RESULTS_DIR=/app/results

EXPOSE 8000 8001 8002 8003 8004 8005
# Default: all six services on one port (the compose file and the k8s manifests run one service per container).
CMD ["tasmoe", "serve", "all", "--host", "0.0.0.0", "--port", "8000"]
