"""The fork server's side of the sandbox runner.

Loaded by ``_runner.py --fork-server FD`` (``python -I -S -B``, scrubbed environment, own
session), into that process only: exec-started runners never compile it, and the
trainer never imports it. It uses the runner (``__main__``) for everything a program's
run does, so a forked child goes through exactly the code of an exec-started runner
once it has left this module (see :func:`run`).

Only the standard library is used (``-S`` hides site-packages).
"""

import builtins
import marshal
import os
import resource
import sys

import __main__ as _runner

_signal = _runner.signal  # the C module ``_signal``
signal = _signal
_exit = os._exit
_len = len
_int = int
_str = str
_isinstance = isinstance
_SystemExit = SystemExit
_BaseException = BaseException
_compile = _runner._compile
_exec = _runner._exec
_json = _runner._json
_short = _runner._short
_format_exc = _runner._format_exc
_libc = _runner._libc
PR_SET_PDEATHSIG = _runner.PR_SET_PDEATHSIG


def run(ctl_fd, netns=False):
    """Serve fork requests on ``ctl_fd``; in each forked child, run the runner's ``main``.

    With ``netns`` the fork server first moves into a new, empty network namespace (if the OS
    allows it without a user namespace), which every child it forks inherits; it then
    answers ``b"ready netns"`` instead of ``b"ready"``.
    """
    _fork_server_child(_fork_server_serve(ctl_fd, netns))


_FORK_SERVER_PRELOAD = (
    # what the runner itself may need (ctypes for unshare/prctl, traceback for errors)
    "ctypes",
    "traceback",
    "fcntl",
    # stdlib modules HumanEval-style programs import most (``typing`` alone is ~10 ms)
    "typing",
    "re",
    "collections",
    "math",
    "itertools",
    "functools",
    "heapq",
    "bisect",
    "string",
    "operator",
    "copy",
    # what the test process of a ClassEval check imports (its unittest tests)
    "unittest",
)
# Signals a sandboxed program could send the fork server (without a PID namespace it is the
# program's parent); ignored in the fork server, restored in each child.
_FORK_SERVER_IGNORED = (
    "SIGHUP",
    "SIGINT",
    "SIGQUIT",
    "SIGTERM",
    "SIGUSR1",
    "SIGUSR2",
    "SIGALRM",
    "SIGVTALRM",
    "SIGPROF",
    "SIGTSTP",
    "SIGTTIN",
    "SIGTTOU",
    "SIGIO",
    "SIGPWR",
    "SIGWINCH",
    "SIGURG",
)


def _noop_handler(signum, frame):
    pass


def _killpg(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass


def _reap(pid):
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


PR_SET_CHILD_SUBREAPER = 36


def _child_pids():
    """This process's children (zombies included); ``None`` when the kernel won't say."""
    me = os.getpid()
    try:
        with open(f"/proc/{me}/task/{me}/children") as fh:
            return [_int(x) for x in fh.read().split()]
    except (OSError, ValueError):
        return None


def _sweep(keep):
    """Kill and reap every child but ``keep``: what a program left behind.

    The fork server is a child subreaper, so processes whose parent died (a PID namespace's
    init killed together with its runner, a daemon that left with ``setsid()`` when
    there is no PID namespace) are re-parented to it. They are killed and reaped here,
    so none stays a zombie or keeps running. ``keep`` (the last child, kept unreaped to
    reserve its process-group id) is left alone.
    """
    for _ in range(1000):
        kids = _child_pids()
        if kids is None:
            break
        others = [pid for pid in kids if pid != keep]
        if not others:
            return
        for pid in others:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for pid in others:
            _reap(pid)
    # No /proc children list: reap what has exited; the next request reaps the rest.
    if keep is None:
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    return
            except ChildProcessError:
                return


_WARM_UP_PROGRAM = """
import math, typing, collections
from typing import List, Optional
def f(xs: List[int], k: Optional[int] = None) -> int:
    total = sum(x * x for x in xs if x % 2 == 0)
    pairs = {x: [y for y in range(x)] for x in range(3)}
    return total + len(pairs) + (k or 0)
class C:
    def __init__(self, v):
        self.v = v
    def __repr__(self):
        return f"C({self.v!r})"
try:
    assert f([1, 2, 3, 4], 1) == 21, "sum"
    s = repr(C("x")) + str(math.floor(2.5)) + "".join(sorted("cba"))
    d = collections.Counter(s).most_common(2)
    g = lambda a, *b, **c: (a, b, c)
    g(1, 2, z=3)
    raise ValueError("warm-up")
except ValueError as exc:
    message = str(exc)
"""


def _fork_server_warm_up():
    """Run the runner's own code paths once on fixed, trusted inputs.

    A forked child pays a page fault (a page copy) for every page it writes for the
    first time; code paths that initialize state lazily on first use (the compiler,
    ``marshal``, ctypes function lookups, ``traceback``) cost a few hundred of them,
    i.e. milliseconds. Doing them once here leaves that state initialized in every
    child. Only constant inputs are used: no model code runs in the fork server.
    """
    try:
        libc = _libc()
        libc.prctl  # noqa: B018 - resolve and cache the function pointers
        libc.unshare  # noqa: B018
        libc.syscall  # noqa: B018
        _runner._sock_fprog()
    except Exception:
        pass
    try:  # filesystem isolation: the module, its libc prototypes and the mount plan
        _runner._check_module()
        mounts = _runner._mounts_module()
        mounts.libc()
        mounts.base_plan()
        mounts.effective_capabilities()
    except Exception:
        pass
    try:
        for _ in range(2):
            code = _compile(_WARM_UP_PROGRAM, "<warm-up>", "exec")
            _exec(code, {"__name__": "__warm_up__", "__builtins__": builtins})
        cfg = {"mode": "check", "code": _WARM_UP_PROGRAM, "plan": [["x = 1", False]]}
        marshal.loads(marshal.dumps(cfg))
        try:
            raise ValueError("warm-up")
        except ValueError as exc:
            _short(exc)
            _format_exc()
        rec = {"kind": "verdict", "passed": 1, "units": [True], "errors": ["a\u00e9"]}
        (_json(rec) + "\n").encode("utf-8")
        resource.getrlimit(resource.RLIMIT_AS)
        import atexit

        atexit._ncallbacks()
    except Exception:
        pass


def _fork_server_serve(ctl_fd, netns=False):
    """Serve fork requests until the parent goes away; returns only in a forked child.

    Protocol on the ``SOCK_SEQPACKET`` socket ``ctl_fd``: the parent sends ``b"run"``
    with four descriptors; the fork server forks and answers ``b"pid N"`` (or ``b"err ..."``),
    then ``b"exit RC"`` when that child has exited and what it left in its process group
    was killed. The exited child is kept as a zombie (so its process-group id cannot be
    reused while the parent may still ``killpg`` it) until the next request arrives.
    One child at a time. EOF: kill the child's group and exit.
    """
    import select
    import socket

    _runner._prepare()
    for name in _FORK_SERVER_PRELOAD:
        try:
            __import__(name)
        except Exception:
            pass
    _fork_server_warm_up()
    import gc

    gc.collect()
    gc.freeze()  # children's collections skip the fork server's objects (no copy-on-write)
    ctl = socket.socket(fileno=ctl_fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    saved = {}
    for name in _FORK_SERVER_IGNORED:
        sig = getattr(signal, name, None)
        if sig is not None:
            saved[sig] = signal.getsignal(sig)
            signal.signal(sig, signal.SIG_IGN)
    saved[signal.SIGCHLD] = signal.getsignal(signal.SIGCHLD)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, _noop_handler)
    me = os.getpid()
    try:  # orphans of our children come to us, not to the trainer (which may be PID 1)
        _libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except Exception:
        pass
    running = None  # the child being run
    zombie = None  # the last child: exited, reported, not reaped yet
    in_netns = bool(netns) and _runner._unshare(_runner.CLONE_NEWNET)
    ctl.send(b"ready netns" if in_netns else b"ready")
    while True:
        if running is not None:
            info = os.waitid(os.P_PID, running, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if info is not None:
                rc = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
                _killpg(running)
                _sweep(keep=running)
                zombie, running = running, None
                try:
                    ctl.send(b"exit %d" % rc)
                except OSError:
                    pass
        ready = select.select([ctl, wake_r], [], [])[0]
        if wake_r in ready:
            try:
                while os.read(wake_r, 512):
                    pass
            except OSError:
                pass
        if ctl not in ready:
            continue
        try:
            msg, fds, _flags, _addr = socket.recv_fds(ctl, 64, 8)
        except OSError:
            msg, fds = b"", []
        if not msg:  # the parent closed its end or died: take the child down, leave
            if running is not None:
                _killpg(running)
            _sweep(keep=None)
            _exit(0)
        if zombie is not None:
            _reap(zombie)
            zombie = None
            _sweep(keep=None)
        if msg != b"run" or _len(fds) != 4 or running is not None:
            for fd in fds:
                os.close(fd)
            ctl.send(b"err malformed request")
            continue
        try:
            pid = os.fork()
        except OSError as exc:
            for fd in fds:
                os.close(fd)
            ctl.send(b"err " + _short(exc).encode("utf-8", "replace"))
            continue
        if pid == 0:
            # The child: die with the fork server, drop everything of it, leave its code.
            try:
                _libc().prctl(PR_SET_PDEATHSIG, _int(signal.SIGKILL), 0, 0, 0)
            except Exception:
                pass
            if os.getppid() != me:
                _exit(1)  # the fork server is already gone; the parent retries elsewhere
            signal.set_wakeup_fd(-1)
            for sig, handler in saved.items():
                signal.signal(sig, handler)
            ctl.detach()
            return fds
        for fd in fds:
            os.close(fd)
        running = pid
        ctl.send(b"pid %d" % pid)


def _fork_server_child(fds):
    """In a freshly forked child: own session, descriptors 0-3, nothing else open."""
    _runner._FORKED = True
    os.setsid()
    import fcntl

    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in fds]
    for target, fd in enumerate(high):
        os.dup2(fd, target)
    _close_fds_from(4)
    sys.argv[:] = [sys.argv[0]]
    try:
        _runner.main()
        code = 0
    except _SystemExit as exc:
        code = _exit_code(exc.code)
    except _BaseException:
        try:
            sys.stderr.write(_format_exc())
        except _BaseException:
            pass
        code = 1
    _fork_exit(code)


def _exit_code(value):
    """The exit status the interpreter derives from ``SystemExit(value)``."""
    if value is None:
        return 0
    if _isinstance(value, _int):
        return value & 0xFF
    try:
        sys.stderr.write(_str(value) + "\n")
    except _BaseException:
        pass
    return 1


def _fork_exit(code):
    """End a forked child the way interpreter shutdown would, minus the heap teardown.

    A normal exit would tear down every module the fork server imported, writing to (so
    copying) nearly every page inherited from it: several milliseconds per program. The
    steps a program can observe are kept, in the interpreter's order: wait for
    non-daemon threads, run ``atexit`` callbacks, flush stdout/stderr, collect the
    program's objects (so their finalizers run and their files are flushed), flush again;
    exit status 120 if a flush failed.
    """
    try:
        threading = sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()
    except _BaseException:
        pass
    try:
        import atexit

        atexit._run_exitfuncs()
    except _BaseException:
        pass
    failed = _flush_std_files()
    try:
        import gc

        gc.collect()
    except _BaseException:
        pass
    failed = _flush_std_files() or failed
    for name in ("__stdout__", "__stderr__"):
        try:
            getattr(sys, name).flush()
        except _BaseException:
            pass
    # The interpreter exits with 120 when flushing stdout/stderr at exit fails.
    _exit(120 if failed else code)


def _flush_std_files():
    """Flush ``sys.stdout``/``sys.stderr`` as interpreter shutdown does; True on failure."""
    failed = False
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name, None)
        if stream is None:
            continue
        try:
            if stream.closed:
                continue
        except _BaseException:
            pass
        try:
            stream.flush()
        except _BaseException as exc:
            failed = True
            if name == "stdout":
                try:
                    sys.stderr.write(
                        f"Exception ignored in: {stream!r}\n" + _short(exc, 2000) + "\n"
                    )
                    sys.stderr.flush()
                except _BaseException:
                    pass
    return failed


def _close_fds_from(low):
    """Close every descriptor ``>= low`` (what ``close_fds=True`` does for exec)."""
    try:
        open_fds = [_int(name) for name in os.listdir("/proc/self/fd")]
    except (OSError, ValueError):
        open_fds = None
    if open_fds is None:
        os.closerange(low, os.sysconf("SC_OPEN_MAX"))
        return
    for fd in open_fds:
        if fd >= low:
            try:
                os.close(fd)
            except OSError:
                pass  # the directory's own descriptor, already closed
