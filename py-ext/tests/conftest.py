"""Fixtures: a private redis-server for the suite (see harness.py)."""

from harness import queue, redis_url, server

__all__ = ["queue", "redis_url", "server"]
