"""Persistence: the PostgreSQL record (schema, migrations, repository functions, event log)."""
