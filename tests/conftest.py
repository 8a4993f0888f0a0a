"""Cross-language tests share py-ext's harness: a real redis-server per session."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "py-ext", "tests"))

from harness import queue, redis_url, server  # noqa: E402

__all__ = ["queue", "redis_url", "server"]
