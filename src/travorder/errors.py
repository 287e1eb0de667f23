"""Errors that travorder reports to its users.

Every error a user can cause (a bad file, a bad name, a bad option) is a
:class:`TravorderError`; the command line prints its message on one line and exits
with code 2. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any


class TravorderError(ValueError):
    """A problem with the user's input, reported as one line."""


class GraphError(TravorderError):
    """An operation graph that is not valid (duplicate names, cycles, bad costs...)."""


class FormatError(TravorderError):
    """A file that cannot be read: missing, empty, truncated, or of an unknown format."""


class BatchError(GraphError):
    """A graph that cannot be costed at the batch asked for (``batch=``, ``--batch``)."""


class DimsError(TravorderError):
    """Values for symbolic dimensions that a model does not have (``dims=``, ``--dim``)."""


def check_regular(path: str | os.PathLike[str], what: str) -> None:
    """Refuse a path that is neither a regular file nor a folder (a device such as
    /dev/zero, or a pipe), whose reading would not end, naming ``what`` it should be."""
    p = Path(path)
    if p.exists() and not p.is_file() and not p.is_dir():
        raise FormatError(f"{str(p)!r} is not a regular file (a device or a pipe): give a "
                          f"{what}")


def read_text(path: str | os.PathLike[str], what: str) -> str:
    """The text of a user's file, or a `FormatError` naming ``what`` it should have been."""
    p = Path(path)
    check_regular(p, what)
    if p.is_dir():
        raise FormatError(f"{str(p)!r} is a folder, not a {what}")
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FormatError(f"no such {what} {str(p)!r}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise FormatError(f"cannot read {what} {str(p)!r}: {exc}") from None


def write_file(path: str | os.PathLike[str], data: bytes | str, what: str) -> None:
    """Write ``data`` to ``path`` through a temporary file beside it, so an error never
    leaves half a file (nor the temporary one); a `TravorderError` naming ``what`` if the
    file cannot be written. A symbolic link stays one (its target is written), and a file
    written again keeps its permissions."""
    payload = data.encode() if isinstance(data, str) else data
    if writes_in_place(path):
        try:
            with open(path, "wb") as f:
                f.write(payload)
        except OSError as exc:
            raise _cannot_write(path, what, exc) from None
        return
    out = Path(os.path.realpath(path))
    tmp = out.with_name(out.name + ".tmp")
    try:
        tmp.write_bytes(payload)
        if out.exists():
            os.chmod(tmp, out.stat().st_mode & 0o7777)
        os.replace(tmp, out)
    except BaseException as exc:  # Ctrl-C too: no temporary file left behind
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise _cannot_write(path, what, exc) from None
        raise


def writes_in_place(path: str | os.PathLike[str]) -> bool:
    """Whether `write_file` writes into ``path`` rather than replacing it: a device
    (``/dev/null``), a pipe (``/dev/stdout | ...``), or the very file this process's
    output or errors go to, which a new file in its place would cut off."""
    try:
        st = os.stat(path)  # through links, /proc/self/fd's included
    except OSError:
        return False
    if stat.S_ISDIR(st.st_mode):
        return False
    if not stat.S_ISREG(st.st_mode):
        return True
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            if os.path.samestat(st, os.fstat(fd)):
                return True
    return False


def _cannot_write(path: str | os.PathLike[str], what: str, exc: OSError) -> TravorderError:
    return TravorderError(f"cannot write {what} {str(path)!r}: {exc.strerror or exc}")


def json_text(doc: Any, indent: int | None = None) -> str:
    """``doc`` as strict JSON: numpy arrays and numbers as Python's, and NaN and infinities,
    which JSON has not, as ``null``."""
    import numpy as np

    def plain(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        if isinstance(x, list | tuple | np.ndarray):
            return [plain(v) for v in x]
        if isinstance(x, np.generic):
            x = x.item()
        return None if isinstance(x, float) and not math.isfinite(x) else x

    return json.dumps(plain(doc), indent=indent, allow_nan=False)


# A \uD800-\uDFFF escape outside a high-low pair: json reads it into a str that cannot be
# printed or written (UnicodeEncodeError far from the file).  Only a prefilter (it also
# matches after an escaped backslash): the decoded document has the last word.
_LONE_SURROGATE = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
                             r"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}")


def parse_json(text: str | bytes) -> Any:
    r"""``json.loads(text)`` that raises :class:`json.JSONDecodeError` for every document
    that is not plain data, also for one nested too deeply to read (RecursionError) and for
    a string holding a lone surrogate (half of a UTF-16 pair, not text).

    >>> parse_json(r'["\ud83d\ude00"]') == ["\U0001f600"]
    True
    >>> parse_json(r'["\ud800"]')  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    json.decoder.JSONDecodeError: \ud800 alone, half of a UTF-16 pair, not text: line 1 ...
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8-sig")
    try:
        doc = json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply to read", text, 0) from None
    # A find first: the regex alone read a graph 2.6x slower (benchmarks/parse_json.py).
    if "\\u" in text and (match := _LONE_SURROGATE.search(text)):
        try:
            json.dumps(doc, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise json.JSONDecodeError(f"{match.group()} alone, half of a UTF-16 "
                                       "pair, not text", text, match.start()) from None
    return doc


def first_line(exc: BaseException) -> str:
    """What another library's exception says, fit for one line: its first line, cut after
    its first sentence when that line is long (torch's run to thousands of characters),
    or its type's name when it says nothing.

    >>> first_line(NotImplementedError("Could not run 'aten::empty' with arguments from "
    ...            "the 'MPS' backend. This could be because " + "x" * 200))
    "Could not run 'aten::empty' with arguments from the 'MPS' backend"
    """
    text = str(exc).strip()
    if not text:
        return type(exc).__name__
    line = text.splitlines()[0]
    return line.split(". ")[0] if len(line) > 160 else line


def check_seed(seed: Any) -> int:
    """``seed`` if it is a non-negative integer (what numpy's generators take), else a
    `TravorderError`."""
    import numbers

    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise TravorderError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def check_flag(value: Any, what: str, error: type[TravorderError] | None = None) -> bool:
    """``value`` if it is True or False (numpy's too), else an ``error`` (default
    `TravorderError`): "no" and None would read as a choice.

    >>> check_flag(False, "training")
    False
    """
    import numpy as np

    if not isinstance(value, bool | np.bool_):
        raise (error or TravorderError)(f"{what} must be True or False, not {value!r}")
    return bool(value)


def check_format(doc: Any, source: str, name: str, version: int | tuple[int, ...],
                 what: str) -> dict[str, Any]:
    """``doc`` if it is a JSON object ``{"format": name, "format_version": v, ...}`` with
    ``v`` the ``version`` (or one of them); else a `FormatError` saying that ``source`` is
    not a ``what`` or has another version."""
    versions = (version,) if isinstance(version, int) else version
    if not isinstance(doc, dict) or doc.get("format") != name:
        raise FormatError(f"{source}: not a travorder {what}")
    found = doc.get("format_version")
    if found is None:
        raise FormatError(f"{source}: {what} has no format version")
    if isinstance(found, bool) or not isinstance(found, int):
        raise FormatError(f"{source}: {what} format version {found!r} is not a whole number")
    if found not in versions:
        raise FormatError(f"{source}: {what} format version {found!r} is "
                          f"not supported (this travorder reads version "
                          f"{' or '.join(map(str, versions))})")
    return doc
