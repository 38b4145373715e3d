"""Where a checkpoint, savepoint or storage root is, as the user wrote it: a URL
(``file://``, ``s3://``, ...), an absolute path, or a path relative to a working directory,
which means another place in every process that reads it (the driver, its executors, the
control plane)."""

from __future__ import annotations

import os


def is_relative(location: str) -> bool:
    """Neither a URL nor an absolute path."""
    return "://" not in location and not location.startswith("/")


def absolute(location: str) -> str:
    """``location`` as this process's working directory means it: a path made absolute (and
    normalized), a URL as it is."""
    return location if "://" in location else os.path.abspath(location)
