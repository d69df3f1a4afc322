"""Log lines for a long-running agent: text for people, JSON lines for log pipelines.

Both formatters print the record's extra fields (``log.info("…", extra={"reason": "host"})``):
text appends them as ``key=value``, JSON puts them beside ``ts``, ``level``, ``logger`` and
``msg``. Times are UTC with milliseconds. Messages and fields carry text from outside (reasons
naming sysfs types and holders' process names, the desired state): both formatters escape its
control characters, so ``kubectl logs`` on a terminal shows an escape sequence, never runs it.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from reconciler.model.errors import printable

#: Attributes every LogRecord has: anything else on a record came in through ``extra``.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    """The extra fields of ``record``, in the order they were given."""
    return {
        k: v for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")
    }


def _timestamp(record: logging.LogRecord) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{seconds}.{int(record.msecs):03d}Z"


class TextFormatter(logging.Formatter):
    """``2025-01-31T12:00:00.123Z INFO vgpuctl.watch: reconciled reason=host seconds=0.031``"""

    def format(self, record: logging.LogRecord) -> str:
        message = printable(record.getMessage())
        line = f"{_timestamp(record)} {record.levelname} {record.name}: {message}"
        extra = fields_of(record)
        if extra:
            line += " " + " ".join(f"{printable(k)}={_text(v)}" for k, v in extra.items())
        if record.exc_info:
            trace = self.formatException(record.exc_info)
            line += "\n" + "\n".join(map(printable, trace.split("\n")))
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``msg``, then the fields
    (``exc`` holds a traceback when there is one)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": printable(record.getMessage()),
        }
        for key, value in fields_of(record).items():
            doc.setdefault(printable(key), _escaped(value))
        if record.exc_info:
            trace = self.formatException(record.exc_info)
            doc["exc"] = "\n".join(map(printable, trace.split("\n")))
        return json.dumps(doc, ensure_ascii=False, default=str)


def _escaped(value: object) -> object:
    """``value`` with the control characters of its text escaped (JSON escapes C0 controls
    itself, not DEL nor the C1 ones such as CSI, U+009B)."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable(str(k)): _escaped(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_escaped(v) for v in value]
    return value


def _text(value: object) -> str:
    if isinstance(value, dict | list | tuple):
        return json.dumps(_escaped(value), ensure_ascii=False, separators=(",", ":"), default=str)
    text = str(value)
    if not text or not text.isprintable() or any(c.isspace() or c in '"=' for c in text):
        # JSON quoting escapes C0 controls; printable the rest (DEL, C1).
        return printable(json.dumps(text, ensure_ascii=False))
    return text


def configure(*, log_format: str, level: int = logging.INFO) -> logging.Handler:
    """Send every logger's records to stderr in ``log_format`` (``text`` or ``json``).

    Returns the handler installed on the root logger (to remove it again in tests).
    """
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level)
    # urllib3 warns of each retry of a request to an API server that is down; the failure
    # itself is logged once, by the reconcile that met it.
    logging.getLogger("urllib3").setLevel(max(level, logging.ERROR))
    return handler
