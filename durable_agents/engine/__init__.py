"""The durable engine: plain Python, no Django, Celery or ninja (a test enforces it)."""
