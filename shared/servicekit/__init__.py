"""What both services need from FastAPI, SQLAlchemy, alembic and pydantic-settings, written once.

``db`` (engine policy, sessions, transactions), ``models`` (naming convention, UTC timestamps),
``migrations`` and ``alembic_env`` (running each service's alembic environment), ``settings`` (the common
settings), ``exceptions`` and ``handlers`` (errors to HTTP answers, the common ones defined once),
``principal`` and ``tokens`` (who calls, bearer tokens at rest), ``health``, ``app`` (CORS and the
throttle), plus the guards, serving, TLS, OpenAPI, hash-chain and SQLite-turn helpers. The pure packages
of ``shared`` (``privacy``, the GP and strategies) never import this.
"""
