"""Shared test configuration. Each part has its own conftest under tests/<part>/."""
