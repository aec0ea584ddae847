"""A worker function for tests of torch's launcher: a module of its own, so that a spawned worker
imports only this (a test module would bring pytest, Hydra and perflab's app into every worker)."""

import time
from pathlib import Path


def sleep_once_started(started: str) -> None:
    """Say it is running (a file), then sleep until it is stopped."""
    Path(started).touch()
    time.sleep(300)
