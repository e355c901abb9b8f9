# Image for the example site's docker-compose services (web, worker, beat).
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

RUN useradd --create-home --uid 1000 app

# Install the library (with the provider SDKs, and the mcp SDK the stock desk's server needs)
# first so editing the example does not reinstall dependencies.
COPY pyproject.toml README.md LICENSE MANIFEST.in ./
COPY durable_agents ./durable_agents
RUN pip install ".[openai,anthropic,mcp,example]"

COPY --chown=app:app manage.py ./
COPY --chown=app:app example_project ./example_project
RUN chown app:app /app

USER app

# The static files, collected into the image (STATIC_ROOT, /app/staticfiles) under names that
# carry a hash of their content, and compressed, for WhiteNoise to serve. Importing the
# settings outside debug needs secrets: throwaway ones, used for nothing else (collectstatic
# touches no database).
RUN DJANGO_SECRET_KEY="$(python -c 'import secrets; print(secrets.token_urlsafe(50))')" \
    WEBHOOK_SECRET="$(python -c 'import secrets; print(secrets.token_urlsafe(32))')" \
    DATABASE_URL=postgres://collectstatic@localhost/none \
    python manage.py collectstatic --noinput

EXPOSE 8000

# The web service's command in docker-compose.yml, exactly (tests/integration/test_compose.py
# compares them): gunicorn with 2 processes of 32 threads, so open run pages, each holding a
# thread with its live stream, leave threads for every other request (docs/celery.md,
# "Serving the web process"). The migrations are docker-compose.yml's `migrate` service, not
# part of starting the web.
CMD ["gunicorn", "example_project.wsgi", "--bind=0.0.0.0:8000", "--worker-class=gthread", "--workers=2", "--threads=32", "--access-logfile=-"]
