"""The sandbox's seccomp filters: kernel objects a run must not share with other runs.

Namespaces, a private root and a user id of its own keep a program's files, processes and
IPC objects to its run. Some kernel state is outside every namespace: kernel keyrings
(looked up by name, kept per user id until reboot), advisory locks and change
notifications on files that every run can open (the interpreter, the standard library,
``/dev/null``), the page-cache state of those files. Two runs alive at the same time could
use them to pass a solution from one sample to another, and a keyring outlives its run.
So every sandboxed process runs under a seccomp filter (``SandboxLimits(syscall_filter=
True)``, the default), compiled here once per trainer process with libseccomp (its
official Python binding ``seccomp`` where the system has it, else ``pyseccomp`` from
PyPI, the same API over ctypes) and handed to the runner as a BPF program, which installs
it with ``prctl(PR_SET_SECCOMP)`` after dropping its privileges and before any model code
runs (the runner itself imports nothing outside the standard library).

=========================================  ==============================================
system call                                answer
=========================================  ==============================================
``add_key``, ``request_key``, ``keyctl``   ``EPERM``: no keyring is created, joined or read
``flock``; ``fcntl`` ``F_SETLK``,          ``0`` without taking the lock: the call
``F_SETLKW``, ``F_OFD_SETLK``,             "succeeds" and no lock exists, so no other
``F_OFD_SETLKW``                           process can see one (``sqlite3``, which needs
                                           its locks to succeed, works as one connection)
``fcntl`` ``F_GETLK``, ``F_OFD_GETLK``     ``EPERM``: no look at other processes' locks
``fcntl`` ``F_SETLEASE``, ``F_GETLEASE``,  ``EPERM``: no leases, no directory
``F_NOTIFY``                               notifications
``inotify_init``, ``inotify_init1``,       ``EPERM``: no watches on shared files
``fanotify_init``
``cachestat``                              ``ENOSYS``: no page-cache probe of shared files
=========================================  ==============================================

System calls of another architecture (``int 0x80`` from a 64-bit process) kill the
process (libseccomp's default for a foreign architecture). The filter is inherited by
every process of the run and cannot be removed.

:func:`single_process_filter` is the second filter of the single-process fallback of
:mod:`comlrl.envs.sandbox.run_limits`: it refuses new processes (``fork``, ``vfork``,
``clone`` without ``CLONE_THREAD``: ``EAGAIN``, as at a process limit; ``clone3``:
``ENOSYS``, so the C library falls back to ``clone``), threads stay allowed.
"""

from __future__ import annotations

import errno
import functools
import tempfile
from typing import Any

from comlrl.envs.sandbox.limits import SandboxUnavailableError

__all__ = ["shared_state_filter", "single_process_filter", "binding_name"]

_F_GETLK, _F_SETLK, _F_SETLKW = 5, 6, 7
_F_OFD_GETLK, _F_OFD_SETLK, _F_OFD_SETLKW = 36, 37, 38
_F_SETLEASE, _F_GETLEASE, _F_NOTIFY = 1024, 1025, 1026
_CLONE_THREAD = 0x00010000

_KEYRING_CALLS = ("add_key", "request_key", "keyctl")
_NOTIFY_CALLS = ("inotify_init", "inotify_init1", "fanotify_init")
_LOCK_TAKING = (_F_SETLK, _F_SETLKW, _F_OFD_SETLK, _F_OFD_SETLKW)
_REFUSED_FCNTL = (_F_GETLK, _F_OFD_GETLK, _F_SETLEASE, _F_GETLEASE, _F_NOTIFY)

_HOW_TO_GET_IT = (
    "install libseccomp (Debian/Ubuntu: apt install libseccomp2, usually present) and the "
    "pyseccomp package (pip install pyseccomp), or opt out explicitly with "
    "SandboxLimits(syscall_filter=False) if concurrent runs may share kernel keyrings and "
    "file locks"
)


def _binding() -> Any:
    """libseccomp's Python binding: the system's ``seccomp`` or PyPI's ``pyseccomp``.

    Raises:
        SandboxUnavailableError: neither imports (or libseccomp is missing).
    """
    try:
        import seccomp  # type: ignore[import-not-found]  # the distribution's binding

        return seccomp
    except ImportError:
        pass
    try:
        import pyseccomp  # type: ignore[import-untyped]

        return pyseccomp
    except (ImportError, OSError) as exc:  # OSError / AttributeError: no libseccomp.so
        raise SandboxUnavailableError(
            f"the sandbox's seccomp filter needs libseccomp and a binding ({exc}); "
            + _HOW_TO_GET_IT
        ) from exc
    except AttributeError as exc:
        raise SandboxUnavailableError(
            f"libseccomp could not be loaded ({exc}); " + _HOW_TO_GET_IT
        ) from exc


def binding_name() -> str:
    """The module that compiles the filters (``"seccomp"`` or ``"pyseccomp"``).

    Raises:
        SandboxUnavailableError: no binding can be had here.
    """
    return str(_binding().__name__)


def _export(flt: Any) -> bytes:
    with tempfile.TemporaryFile() as fh:
        flt.export_bpf(fh)
        fh.seek(0)
        data = fh.read()
    if not data or len(data) % 8:
        raise SandboxUnavailableError(f"libseccomp exported a malformed filter ({len(data)} bytes)")
    return bytes(data)


@functools.lru_cache(maxsize=1)
def shared_state_filter() -> bytes:
    """The BPF program (``struct sock_filter`` array, native byte order) of the table in the
    module docs.

    Raises:
        SandboxUnavailableError: libseccomp or its binding is missing (see the message).
    """
    sc = _binding()
    try:
        flt = sc.SyscallFilter(sc.ALLOW)
        for name in _KEYRING_CALLS + _NOTIFY_CALLS:
            flt.add_rule(sc.ERRNO(errno.EPERM), name)
        flt.add_rule(sc.ERRNO(0), "flock")
        for cmd in _LOCK_TAKING:
            flt.add_rule(sc.ERRNO(0), "fcntl", sc.Arg(1, sc.EQ, cmd))
        for cmd in _REFUSED_FCNTL:
            flt.add_rule(sc.ERRNO(errno.EPERM), "fcntl", sc.Arg(1, sc.EQ, cmd))
        try:
            flt.add_rule(sc.ERRNO(errno.ENOSYS), "cachestat")
        except (OSError, ValueError, RuntimeError):
            pass  # a libseccomp too old to know it; the kernel then lacks it or allows it
        return _export(flt)
    except SandboxUnavailableError:
        raise
    except Exception as exc:  # noqa: BLE001 - the binding's own errors, reported whole
        raise SandboxUnavailableError(
            f"libseccomp could not build the sandbox's filter: {type(exc).__name__}: {exc}"
        ) from exc


@functools.lru_cache(maxsize=1)
def single_process_filter() -> bytes:
    """The BPF program that refuses new processes (threads allowed), see the module docs.

    Raises:
        SandboxUnavailableError: libseccomp or its binding is missing.
    """
    sc = _binding()
    try:
        flt = sc.SyscallFilter(sc.ALLOW)
        flt.add_rule(sc.ERRNO(errno.EAGAIN), "fork")
        flt.add_rule(sc.ERRNO(errno.EAGAIN), "vfork")
        flt.add_rule(sc.ERRNO(errno.EAGAIN), "clone", sc.Arg(0, sc.MASKED_EQ, _CLONE_THREAD, 0))
        flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
        return _export(flt)
    except Exception as exc:  # noqa: BLE001
        raise SandboxUnavailableError(
            f"libseccomp could not build the single-process filter: {type(exc).__name__}: {exc}"
        ) from exc
