"""What both services need from FastAPI, SQLAlchemy and alembic, written once.

The pure packages of ``shared`` (``privacy``, the GP and strategies) never import this.
"""
