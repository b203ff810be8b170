"""The shared store: PostgreSQL, for many workers on many hosts (the ``postgres`` extra)."""
