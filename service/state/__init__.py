"""Durable state behind one small interface: SQLite in the data dir (the
embedded default) or PostgreSQL when MILLM_DATABASE_URL is set, so replicas
share what operators write."""
