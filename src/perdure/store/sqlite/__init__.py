"""The embedded store: one SQLite file shared by the threads and processes of a host."""
