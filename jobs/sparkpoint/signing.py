"""Authenticated messages: every envelope signed with its job's key and numbered by its sender.

Anyone who can write to Redis could otherwise acknowledge a checkpoint for a subtask that never
snapshotted, fail a job over or finish it. So each envelope carries ``sender`` (a nonce of the
writing process: a driver incarnation, its heartbeat thread, a control-plane process), ``seq``
(increasing per sender) and ``sig``: HMAC-SHA256, with the job's key, over the canonical bytes
of the envelope without ``sig`` (:func:`canonical_bytes`). Readers refuse an unsigned or forged
message, and one whose ``seq`` is not above the last one they applied from that sender (a
replayed copy; see ``docs/control-plane.md``, "Authenticated messages").

A job's key is ``HMAC-SHA256(server secret, "sparkpoint job key" NUL job id)``. The server
secret lives in the control plane's data directory (``event-secret``, mode 0600); a driver
reads it there (same machine), or is given its own job's key in ``SPARKPOINT_JOB_KEY``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import orjson

from sparkpoint import protocol as p
from sparkpoint.errors import ConfigurationError

#: The server secret's file in the control plane's data directory (mode 0600).
SECRET_FILE = "event-secret"
#: A driver's job key (hex) when it cannot read the server secret (another machine).
JOB_KEY_ENV = "SPARKPOINT_JOB_KEY"
DEFAULT_DATA_DIR = ".sparkpoint/server"
_KEY_LABEL = b"sparkpoint job key\x00"
_SIGNED_FIELDS = tuple(name for name in p.Envelope.model_fields if name != "sig")


def canonical_bytes(envelope: p.Envelope) -> bytes:
    """What is signed: the envelope without ``sig`` as sorted, compact JSON."""
    data = envelope.model_dump(mode="json", exclude={"sig"})
    return json.dumps(
        data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def signature(key: bytes, envelope: p.Envelope) -> str:
    """The hex HMAC-SHA256 of ``envelope`` (its ``sig`` left out) with ``key``."""
    return hmac.new(key, canonical_bytes(envelope), hashlib.sha256).hexdigest()


def job_key(secret: bytes, job_id: str) -> bytes:
    """The key of one job, derived from the server secret (a job's key signs nothing of
    another job's)."""
    return hmac.new(secret, _KEY_LABEL + job_id.encode(), hashlib.sha256).digest()


def verify(key: bytes, envelope: p.Envelope) -> str | None:
    """Why ``envelope`` is not authentic under ``key``, or None when it is.

    First the signature of the envelope's fields as orjson writes them (sorted keys, compact,
    UTF-8, NaN as ``null`` as pydantic's dump writes it): the canonical bytes themselves for
    what jobs send, in a fraction of the time (the canonical encoding is a third of a signed
    ingest). A match means the signer signed these very field values. Anything else (a number
    orjson writes otherwise, such as ``1e-05``; a forgery) is judged on the canonical bytes."""
    if envelope.sig is None or envelope.sender is None or envelope.seq is None:
        return "unsigned (no sig, sender or seq)"
    if signed_as_written(key, envelope):
        return None
    if not hmac.compare_digest(envelope.sig, signature(key, envelope)):
        return "bad signature"
    return None


def signed_as_written(key: bytes, envelope: p.Envelope) -> bool:
    """Whether ``envelope``'s signature is that of its fields as orjson writes them (False
    also when it is unsigned, or orjson cannot write it: an int beyond 64 bits...)."""
    if envelope.sig is None:
        return False
    fields = {name: getattr(envelope, name) for name in _SIGNED_FIELDS}
    try:
        raw = orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        return False
    return hmac.compare_digest(envelope.sig, hmac.new(key, raw, hashlib.sha256).hexdigest())


# ----------------------------------------------------------------------------- keys


def load_or_create_secret(data_dir: str | os.PathLike[str]) -> bytes:
    """The control plane's server secret: ``<data_dir>/event-secret``, created (mode 0600) the
    first time.

    Raises:
        ConfigurationError: the file exists but is empty or not hex.
    """
    path = Path(data_dir) / SECRET_FILE
    if not path.exists():
        tmp = path.with_name(f".{SECRET_FILE}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32) + "\n")
        os.replace(tmp, path)  # a reader never sees half of it
    found = read_secret(data_dir)
    if found is None:
        raise ConfigurationError(f"{path} holds no secret (hex); delete it to have one made")
    return found


def read_secret(data_dir: str | os.PathLike[str]) -> bytes | None:
    """The server secret in ``data_dir``, None when the file is missing or unreadable."""
    try:
        text = (Path(data_dir) / SECRET_FILE).read_text(encoding="utf-8").strip()
        return bytes.fromhex(text) or None
    except (OSError, ValueError):
        return None


def driver_job_key(job_id: str, environ: Mapping[str, str]) -> bytes:
    """A driver's key: ``SPARKPOINT_JOB_KEY`` (hex), else derived from the server secret in
    ``SPARKPOINT_DATA_DIR`` (default ``.sparkpoint/server``) on this machine, else asked of the
    REST API at ``SPARKPOINT_API_URL`` (``POST /jobs/{id}/key``) with the operator's token
    (``SPARKPOINT_API_TOKEN``).

    Raises:
        ConfigurationError: none is available, the variable is not hex, or the API refused.
    """
    given = environ.get(JOB_KEY_ENV, "").strip()
    if given:
        try:
            return bytes.fromhex(given)
        except ValueError as err:
            raise ConfigurationError(f"job {job_id}: {JOB_KEY_ENV} is not hex") from err
    data_dir = environ.get("SPARKPOINT_DATA_DIR") or DEFAULT_DATA_DIR
    secret = read_secret(data_dir)
    api_url, token = environ.get("SPARKPOINT_API_URL"), environ.get("SPARKPOINT_API_TOKEN")
    if secret is None and api_url and token:
        return _key_from_api(job_id, api_url, token)
    if secret is None:
        raise ConfigurationError(
            f"job {job_id} cannot sign its events: no {JOB_KEY_ENV} and no readable "
            f"{Path(data_dir) / SECRET_FILE} (the control plane's data directory: set "
            "SPARKPOINT_DATA_DIR on the control plane's machine, or SPARKPOINT_API_URL and "
            f"SPARKPOINT_API_TOKEN to ask its API, or give the job's key in {JOB_KEY_ENV}; "
            "see docs/control-plane.md)"
        )
    return job_key(secret, job_id)


def _key_from_api(job_id: str, api_url: str, token: str) -> bytes:
    from sparkpoint.rest_client import ApiError, ControlPlaneClient

    client = ControlPlaneClient(api_url, token)
    try:
        answer = client.request("POST", f"/jobs/{job_id}/key")
        return bytes.fromhex(str(answer["key"]))
    except (ApiError, KeyError, TypeError, ValueError) as err:
        raise ConfigurationError(
            f"job {job_id}: no key from the control plane's API: {err}"
        ) from err
    finally:
        client.close()


# ----------------------------------------------------------------------------- writers, readers


class Signer:
    """Numbers and signs the envelopes of one sender, in the order they are written.

    Call :meth:`sign` and write its result under the same lock (:attr:`lock`) when several
    threads share one sender: a reader refuses a ``seq`` below one it already applied.
    """

    def __init__(self, key_of: Callable[[str], bytes], sender: str) -> None:
        """Args:
        key_of: The key of a job id (the driver: its one key; the control plane: derived).
        sender: This writer's nonce (at most 64 characters).
        """
        self.key_of = key_of
        self.sender = sender
        self.lock = threading.Lock()
        self._seq = 0

    def sign(self, envelopes: Sequence[p.Envelope]) -> list[p.Envelope]:
        """The envelopes with this sender, the next sequence numbers and their signatures."""
        signed = []
        for env in envelopes:
            self._seq += 1
            numbered = env.model_copy(update={"sender": self.sender, "seq": self._seq, "sig": None})
            sig = signature(self.key_of(env.job_id), numbered)
            signed.append(numbered.model_copy(update={"sig": sig}))
        return signed


class CommandVerifier:
    """A driver's check of its commands: signed with its key, and each sender's ``seq``
    increasing (a copy of a command it obeyed is refused)."""

    def __init__(self, key: bytes) -> None:
        self.key = key
        self._last: dict[str, int] = {}

    def __call__(self, envelope: p.Envelope) -> str | None:
        """Why the command is refused, or None (then its ``seq`` counts as seen)."""
        reason = verify(self.key, envelope)
        if reason is not None:
            return reason
        assert envelope.sender is not None and envelope.seq is not None
        last = self._last.get(envelope.sender, 0)
        if envelope.seq <= last:
            return f"replayed (seq {envelope.seq} of {envelope.sender}, last {last})"
        self._last[envelope.sender] = envelope.seq
        return None
