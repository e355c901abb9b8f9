# Image for the example site's docker-compose services (web, worker, beat).
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

RUN useradd --create-home --uid 1000 app

# Install the library (and the provider SDKs) first so editing the example does not
# reinstall dependencies.
COPY pyproject.toml README.md LICENSE MANIFEST.in ./
COPY durable_agents ./durable_agents
RUN pip install ".[openai,anthropic,example]"

COPY --chown=app:app manage.py ./
COPY --chown=app:app example_project ./example_project
RUN chown app:app /app

USER app

EXPOSE 8000

# gunicorn serves the WSGI app; docker-compose.yml runs migrations and collectstatic first.
CMD ["gunicorn", "example_project.wsgi", "--bind", "0.0.0.0:8000", "--workers", "3"]
