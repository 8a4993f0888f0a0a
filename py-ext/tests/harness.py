"""Test harness shared by py-ext/tests and the cross-language tests in tests/: a real
redis-server on a free loopback port (never a mock), and pytest fixtures."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import Callable

import pytest

import delayq


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    def __init__(self, *args: str) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="delayq-py-")
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--dir", self.dir, *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while self.cli("PING") != "PONG":
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} did not start")
            time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def cli(self, *args: str) -> str:
        out = subprocess.run(
            ["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True, check=False
        )
        return out.stdout.strip()

    def keys(self) -> list[str]:
        out = self.cli("KEYS", "*")
        return sorted(k for k in out.splitlines() if k)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def server() -> Iterator[RedisServer]:
    s = RedisServer()
    yield s
    s.stop()


@pytest.fixture
def redis_url(server: RedisServer) -> str:
    server.cli("FLUSHALL")
    return server.url


@pytest.fixture
def queue(redis_url: str) -> delayq.DelayQueue:
    return delayq.DelayQueue(redis_url, "jobs")


def wait_for(seconds: float, what: str, cond: Callable[[], bool]) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def drained(q: delayq.DelayQueue) -> bool:
    s = q.stats()
    return s["scheduled"] + s["ready"] + s["inflight"] == 0


HERE = os.path.dirname(os.path.abspath(__file__))
