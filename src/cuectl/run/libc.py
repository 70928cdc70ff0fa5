"""libc functions called without ``import ctypes``: it defines its whole type zoo, ~3 ms of
a ~25 ms ``cuectl run -- true`` (cuectl.run.quick), for a call or two. Built here on
``_ctypes``, ctypes' C core, as ctypes builds them itself; nothing imported but that."""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# ctypes' own type codes: the ones these functions take.
_CODES = frozenset("iIlL")


def function(name: str, argtypes: str, restype: str) -> Any:
    """libc's ``name``, taking arguments of the ctypes type codes in ``argtypes`` (``i`` int,
    ``I`` unsigned int, ``l`` long, ``L`` unsigned long) and returning ``restype``; errno
    kept for ``ctypes.get_errno`` (``use_errno``). Raises ``AttributeError`` where libc has
    no such function (an older glibc), ``OSError`` where it cannot be reached."""
    if not set(argtypes + restype) <= _CODES or len(restype) != 1:
        raise ValueError(f"libc.function: unsupported type codes {argtypes!r} -> {restype!r}")
    try:
        import _ctypes

        handle = _ctypes.dlopen(None)  # type: ignore[arg-type]  # NULL: the program and its libc
    except (ImportError, AttributeError, TypeError):  # another Python's ctypes: the public way
        return _public(name, argtypes, restype)
    try:
        _ctypes.dlsym(handle, name)
    except OSError:
        raise AttributeError(f"libc has no {name}") from None
    try:
        simple = {
            code: type(f"C_{code}", (_ctypes._SimpleCData,), {"_type_": code}) for code in set(argtypes + restype)
        }

        class Function(_ctypes.CFuncPtr):
            _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
            _argtypes_ = tuple(simple[code] for code in argtypes)
            _restype_ = simple[restype]

        class Libc:  # what CFuncPtr((name, library)) reads of a library: its dlopen handle
            _handle = handle

        return Function((name, Libc()))  # type: ignore[arg-type]
    except (AttributeError, TypeError):  # ctypes' core is not what this Python's ctypes is built on
        return _public(name, argtypes, restype)


def _public(name: str, argtypes: str, restype: str) -> Any:
    import ctypes

    types = {"i": ctypes.c_int, "I": ctypes.c_uint, "l": ctypes.c_long, "L": ctypes.c_ulong}
    func = getattr(ctypes.CDLL(None, use_errno=True), name)
    func.argtypes = tuple(types[code] for code in argtypes)
    func.restype = types[restype]
    return func


_PR_GET_DUMPABLE, _PR_SET_DUMPABLE = 3, 4


def set_undumpable() -> bool:
    """``prctl(PR_SET_DUMPABLE, 0)`` (Linux): no other process of this uid can read this
    one's memory (``/proc/PID/mem``, ``ptrace``), environment or other private ``/proc``
    files any more, even on a kernel without Yama (``ptrace_scope`` 0), and no core file
    is written. For every long-lived process that may hold a secret (a PostgreSQL password,
    API tokens): a frame runs as its worker's user, and read the password from
    ``/proc/$PPID/mem`` (issue 35). The process's own ``/proc/self`` stays usable (its fds,
    its children, its status); its ``/proc/PID`` files become root's. Children get the flag
    too, and lose it again when they ``exec`` (a frame stays an ordinary process).
    False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return bool(function("prctl", "LLLLL", "i")(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)
    except (OSError, AttributeError, TypeError):
        return False


def is_dumpable() -> bool | None:
    """``prctl(PR_GET_DUMPABLE)``; None where unsupported."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return bool(function("prctl", "LLLLL", "i")(_PR_GET_DUMPABLE, 0, 0, 0, 0))
    except (OSError, AttributeError, TypeError):
        return None
