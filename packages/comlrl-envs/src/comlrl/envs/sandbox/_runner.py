"""Child-side runner of the sandbox (executed as ``python -I -S -B _runner.py``).

This file is never imported by the trainer. The parent starts it in a fresh session, in a
throwaway working directory, with a scrubbed environment, and writes two ``marshal``
documents to its stdin. The runner, *before any model-written code runs*:

1. reads the first instructions document from stdin (length-prefixed: the program,
   limits, work dir; never a byte more);
2. keeps the result-pipe fd number (the "honest channel") in a local; the second
   document (the nonce, and in check mode the test plan) is read only when needed: in
   check mode by the test process after it forked the candidate process
   (``_runner_check.py``), so the program's process never holds it;
3. moves into new network, PID, mount and IPC namespaces when the OS allows it
   (``unshare(2)`` via ``ctypes``; first without, then with a user namespace whose only
   id is the trainer's), builds the program's own root and moves into it, drops every
   privilege (``_runner_mounts.py``; refuses to go on, with a reason on the result
   channel, when ``filesystem="isolated"`` cannot be had), and applies the rlimits;
4. when a PID namespace was entered, forks a minimal init (PID 1 of that namespace) that
   forks the worker (PID 2) which runs the program: when the worker ends, the init exits
   and the kernel kills every process left in the namespace, including ones that called
   ``setsid()`` to leave the process group.

Then it runs the program (``mode="exec"``), or, in ``mode="check"``, becomes the test
process of ``_runner_check.py`` (the program runs in a candidate process it forks), and
writes nonce-tagged JSON lines to the result pipe. Only the lines
the runner writes are trusted by the parent; stdout/stderr are just captured text.

Fork-server mode (``_runner.py --fork-server FD``, see :mod:`comlrl.envs.sandbox.fork_executor`): the
same script, started the same way (``-I -S -B``, scrubbed environment, own session),
loads ``_runner_fork_server.py`` and becomes a fork server: it takes the builtins snapshot, imports
what the runner needs, and then only forks on request. Each forked child leaves the
fork server's code for good, starts its own session, keeps only its four descriptors (the
instructions pipe as stdin, stdout, stderr, the result pipe as fd 3), and then runs
:func:`main` exactly as an exec-started runner does (steps 1-4 above). The fork server never
sees the program or the nonce (they travel through the instructions pipe, straight to
the child), never runs model code, and is not changed by its children: they are copies.

Only the standard library is used (``-S`` hides site-packages).
"""

import _signal as signal  # the C module: ``signal`` would import ``enum`` (~5 ms)
import builtins
import marshal
import os
import resource
import sys

# Everything the harness needs is captured here, before model code can rebind anything.
_write = os.write
_exit = os._exit
_setitimer = signal.setitimer
_signal = signal.signal
_exec = builtins.exec
_compile = builtins.compile
_BaseException = builtins.BaseException
_Exception = builtins.Exception
_SystemExit = builtins.SystemExit
_SyntaxError = builtins.SyntaxError
_callable = builtins.callable
_len = builtins.len
_str = builtins.str
_type = builtins.type
_dict = builtins.dict
_repr = builtins.repr
_isinstance = builtins.isinstance
_bool = builtins.bool
_int = builtins.int
_float = builtins.float
_ord = builtins.ord
_list = builtins.list
_tuple = builtins.tuple
_PRISTINE_BUILTINS = None  # filled by main() once exit/quit are installed

CLONE_NEWUSER = 0x10000000
CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000
CLONE_NEWIPC = 0x08000000
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_SECCOMP = 22
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_MODE_FILTER = 2
_SELF = sys.modules[__name__]


class _UnitTimeout(BaseException):
    """Raised by the SIGALRM handler when one test unit runs past its time budget."""


def _on_alarm(signum, frame):
    raise _UnitTimeout()


def _json(obj):
    """Minimal JSON encoder (``json`` imports ``re``: ~9 ms of start-up we skip)."""
    if obj is None:
        return "null"
    if _isinstance(obj, _bool):
        return "true" if obj else "false"
    if _isinstance(obj, (_int, _float)):
        return _repr(obj) if _isinstance(obj, _int) else _repr(_float(obj))
    if _isinstance(obj, _str):
        out = []
        for ch in obj:
            code = _ord(ch)
            if ch == '"' or ch == "\\":
                out.append("\\" + ch)
            elif code < 0x20 or code > 0x7E:
                if code > 0xFFFF:
                    code -= 0x10000
                    out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
                else:
                    out.append(f"\\u{code:04x}")
            else:
                out.append(ch)
        return '"' + "".join(out) + '"'
    if _isinstance(obj, (_list, _tuple)):
        return "[" + ",".join(_json(x) for x in obj) + "]"
    if _isinstance(obj, _dict):
        return "{" + ",".join(_json(_str(k)) + ":" + _json(v) for k, v in obj.items()) + "}"
    return _json(_repr(obj))


def _format_exc():
    try:
        import traceback

        return traceback.format_exc()
    except _BaseException:
        return "(traceback unavailable)\n"


def _emit(fd, nonce, record):
    record = _dict(record)
    record["nonce"] = nonce
    data = (_json(record) + "\n").encode("utf-8")
    while data:
        n = _write(fd, data)
        data = data[n:]


def _short(exc, limit=300):
    try:
        text = _type(exc).__name__ + ": " + _str(exc)
    except _BaseException:
        text = _type(exc).__name__
    return text if _len(text) <= limit else text[:limit] + "..."


_LIBC = None  # ctypes handle of libc, made on first use (the fork server makes it up front)


def _libc():
    global _LIBC
    if _LIBC is None:
        import ctypes

        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def _unshare(flags):
    try:
        import ctypes

        return _libc().unshare(ctypes.c_int(flags)) == 0
    except Exception:
        return False


_MOUNTS = None  # _runner_mounts.py, loaded when a run isolates its filesystem


def _mounts_module():
    """Load ``_runner_mounts.py`` (filesystem isolation) once per process."""
    global _MOUNTS
    if _MOUNTS is None:
        _MOUNTS = _load_sibling("_runner_mounts")
    return _MOUNTS


def _write_file(path, text):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _map_ids(uid, gid):
    """Map this process's ids into the user namespace it just made (identity, one id)."""
    _write_file("/proc/self/setgroups", "deny")
    _write_file("/proc/self/uid_map", f"{uid} {uid} 1\n")
    _write_file("/proc/self/gid_map", f"{gid} {gid} 1\n")


_SOCK_FPROG = None


def _sock_fprog():
    """ctypes ``struct sock_fprog`` (made once; a fork server makes it up front)."""
    global _SOCK_FPROG
    if _SOCK_FPROG is None:
        import ctypes

        class _Prog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

        _SOCK_FPROG = _Prog
    return _SOCK_FPROG


def _install_filter(bpf):
    """Install the seccomp filter ``bpf`` (a ``struct sock_filter`` array compiled by the
    trainer with libseccomp, see ``syscall_filter.py``) on this process and its future
    children; it cannot be removed. Raises ``OSError`` when the kernel refuses it."""
    import ctypes

    buf = ctypes.create_string_buffer(bpf, _len(bpf))
    prog = _sock_fprog()(_len(bpf) // 8, ctypes.cast(buf, ctypes.c_void_p))
    lc = _libc()
    for args in (
        (PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0),
        (PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0),
    ):
        if lc.prctl(*args) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"prctl({args[0]}): {os.strerror(err)}")


def _join_run_group(cfg, fd, info):
    """Move this process into the run's cgroup (every process the run starts follows)."""
    for path in cfg.get("cgroup_procs") or ():
        try:
            _write_file(path, "0")
        except OSError as exc:
            _refuse(fd, info, f"could not join the run's cgroup ({path}): {exc}")


def _refuse(fd, info, reason):
    """Report why the isolation asked for cannot be had, and end without running code."""
    info["refused"] = reason
    _emit(fd, _secrets()["nonce"], info)
    _exit(125)


def _isolate(cfg, fd):
    info = {"kind": "isolation", "netns": False, "pidns": False, "userns": False}
    info["mountns"] = info["ipcns"] = False
    info["executor"] = "fork" if _FORKED else "exec"
    if _FORKED:
        info["fork_server_pid"] = os.getppid()
    want_net = not cfg.get("allow_network", False)
    want_pid = cfg.get("pid_namespace", True)
    want_fs = cfg.get("filesystem", "isolated") == "isolated"
    info["filesystem"] = "isolated" if want_fs else "host"
    inherited = want_net and _FORKED and cfg.get("netns_inherited", False)
    if inherited:
        # The fork server already lives in an empty network namespace of its own (made once,
        # at its start): this child is in it, so it needs no new one.
        want_net = False
        info["netns"] = True
        info["netns_shared_with"] = "fork server"
    flags = (CLONE_NEWNET if want_net else 0) | (CLONE_NEWPID if want_pid else 0)
    flags |= CLONE_NEWNS if want_fs else 0
    # Always a new IPC namespace (SysV shared memory, semaphores, message queues and POSIX
    # message queues): nothing one run creates is seen by another or outlives the run.
    flags |= CLONE_NEWIPC
    _join_run_group(cfg, fd, info)
    uid, gid = os.geteuid(), os.getegid()
    entered = False
    if flags and hasattr(os, "fork"):
        if _unshare(flags):
            entered = True
        elif _unshare(flags | CLONE_NEWUSER):
            entered = info["userns"] = True
            try:
                _map_ids(uid, gid)
            except OSError as exc:
                if want_fs:
                    _refuse(fd, info, f"could not map ids in a user namespace: {exc}")
    if entered:
        info["netns"], info["pidns"] = want_net or inherited, want_pid
        info["mountns"] = want_fs
        info["ipcns"] = True
    if want_fs:
        if not entered:
            _refuse(
                fd,
                info,
                "unshare(CLONE_NEWNS) was refused, also inside a new user namespace",
            )
        mounts = _mounts_module()
        try:
            mounts.enter_new_root(cfg, info)
            if os.geteuid() == 0 and not info["userns"]:
                owner = mounts.UID_BASE + os.getpid()  # the id drop_privileges switches to
                try:
                    os.chown(cfg["workdir"], owner, owner)
                except OSError as exc:
                    if exc.errno != 22:  # EINVAL: a user namespace without that id
                        raise
            mounts.drop_privileges(info, info["userns"], _FORKED)
        except Exception as exc:
            _refuse(fd, info, f"{_type(exc).__name__}: {exc}")
    lim = cfg["limits"]

    def setl(res, value):
        if value is None:
            return
        try:
            resource.setrlimit(res, (int(value), int(value)))
        except (ValueError, OSError):
            pass

    setl(resource.RLIMIT_CORE, 0)
    # soft == hard: at the limit the kernel sends SIGKILL (a PID-namespace init ignores
    # SIGXCPU, the soft-limit signal, unless it installs a handler).
    setl(resource.RLIMIT_CPU, lim.get("cpu_s"))
    if lim.get("memory_mb") is not None:
        setl(resource.RLIMIT_AS, lim["memory_mb"] * 1024 * 1024)
    if lim.get("file_size_mb") is not None:
        setl(resource.RLIMIT_FSIZE, lim["file_size_mb"] * 1024 * 1024)
    setl(resource.RLIMIT_NPROC, lim.get("max_processes"))
    info["uid"] = os.geteuid()
    # RLIMIT_NPROC is per real user and is not checked for root / CAP_SYS_RESOURCE.
    info["nproc_enforced"] = lim.get("max_processes") is not None and os.geteuid() != 0
    info["seccomp"] = False
    if cfg.get("seccomp"):
        try:
            _install_filter(cfg["seccomp"])
        except Exception as exc:
            _refuse(fd, info, f"the seccomp filter was refused: {_short(exc)}")
        info["seccomp"] = True
    else:
        global _SWEEP_KEYS
        _SWEEP_KEYS = info["uid"] != uid  # a user id of the run's own: its keyrings too
    return info


_SWEEP_KEYS = False  # no seccomp filter: clear the run's keyrings when its program ended
_KEYCTL_NR = {"x86_64": 250, "aarch64": 219, "riscv64": 219, "ppc64le": 312, "s390x": 280}


def _clear_keyrings():
    """Unlink every key from this user id's user and user-session keyrings (what a program
    could make outlive its run when no filter refuses keyrings); the kernel then collects
    the keys nothing holds."""
    try:
        import ctypes

        nr = _KEYCTL_NR.get(os.uname().machine)
        if nr is not None:
            for ring in (-4, -5):  # KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING
                _libc().syscall(nr, ctypes.c_long(7), ctypes.c_long(ring))  # KEYCTL_CLEAR
    except Exception:
        pass


def _wait_for(pid):
    while True:
        try:
            return os.waitpid(pid, 0)[1]
        except InterruptedError:
            continue


def _mirror(status):
    """Exit the way a child with wait ``status`` did (same code, or same signal)."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            try:
                signal.signal(sig, signal.SIG_DFL)
            except (OSError, ValueError):
                pass
        try:
            os.kill(os.getpid(), sig)
        except OSError:
            pass
        _exit(128 + sig)
    _exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def _enter_pid_namespace():
    """Run the rest of this script as PID 2 of the new PID namespace.

    Process tree: this process (outside the namespace) -> a minimal init (PID 1, runs no
    model code) -> the worker (PID 2, returns from this function). The init reaps orphans,
    reports the worker's raw wait status through a private pipe and exits; the kernel then
    kills everything left in the namespace. The init dies with this process
    (``PR_SET_PDEATHSIG``), so killing the process group reaches all of it. The program is
    not PID 1 itself because PID 1 ignores signals it has no handler for (even its own
    ``SIGKILL``), which would change how programs behave.
    """
    status_r, status_w = os.pipe()
    init = os.fork()
    if init == 0:
        os.close(status_r)
        try:
            _libc().prctl(PR_SET_PDEATHSIG, _int(signal.SIGKILL), 0, 0, 0)
        except Exception:
            pass
        worker = os.fork()
        if worker == 0:
            os.close(status_w)
            return
        while True:  # PID 1: reap everything until the worker is done
            try:
                pid, status = os.waitpid(-1, os.WUNTRACED)
            except InterruptedError:
                continue
            except ChildProcessError:
                _exit(1)
            if pid == worker and os.WIFSTOPPED(status):
                # Stopped (SIGSTOP from a program): it would hold the run for its whole
                # wall clock; it ends now, without a verdict.
                try:
                    os.kill(worker, signal.SIGKILL)
                except OSError:
                    pass
                continue
            if pid == worker:
                break
        try:
            _write(status_w, _str(status).encode())
        finally:
            _exit(0)
    os.close(status_w)
    data = b""
    while True:
        chunk = os.read(status_r, 64)
        if not chunk:
            break
        data += chunk
    init_status = _wait_for(init)
    if _SWEEP_KEYS:
        _clear_keyrings()  # the whole namespace is dead: nothing of the program runs now
    if data:
        _mirror(_int(data))
    _mirror(init_status)


def _run_exec(cfg, fd, nonce):
    try:
        code = _compile(cfg["code"], "<program>", "exec")
    except (_SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        sys.stderr.write(_format_exc())
        _emit(fd, nonce, {"kind": "syntax_error", "error": _short(exc)})
        sys.stderr.flush()
        _exit(1)
    g = {"__name__": "__main__", "__builtins__": builtins}
    try:
        _exec(code, g)
    except _SystemExit:
        raise  # the program's own exit status, handled by the interpreter
    except _BaseException as exc:
        try:
            sys.stderr.write(_format_exc())
        except _BaseException:
            pass
        _emit(
            fd,
            nonce,
            {"kind": "exception", "error_type": _type(exc).__name__, "error": _short(exc)},
        )
        raise _SystemExit(1) from None


def _counting(fn, counter, name):
    def wrapper(*args, **kwargs):
        counter[name] = counter.get(name, 0) + 1
        return fn(*args, **kwargs)

    try:
        wrapper.__name__ = fn.__name__
        wrapper.__doc__ = fn.__doc__
        wrapper.__wrapped__ = fn
    except _BaseException:
        pass
    return wrapper


def _install_exit_builtins():
    """Provide ``exit``/``quit`` as ``site`` would (the child runs with ``-S``)."""

    def _quit(code=None):
        raise _SystemExit(code)

    builtins.exit = _quit
    builtins.quit = _quit


def _prepare():
    """Install ``exit``/``quit`` and take the builtins snapshot (before any model code)."""
    global _PRISTINE_BUILTINS
    if _PRISTINE_BUILTINS is None:
        _install_exit_builtins()
        _PRISTINE_BUILTINS = dict(builtins.__dict__)


def _read_fd(fd, n=None):
    """``n`` bytes from ``fd`` (to EOF when ``None``), never reading past them."""
    chunks = []
    while n is None or n > 0:
        chunk = os.read(fd, 1 << 16 if n is None else min(n, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        if n is not None:
            n -= _len(chunk)
    return b"".join(chunks)


_SECRETS = None  # the second instructions document: nonce and test plan


def _secrets():
    """Read the second document (the parent wrote it after the first) and close stdin.

    In check mode the test process reads it only after the candidate process was forked,
    so the candidate never holds the nonce or the tests in its memory.
    """
    global _SECRETS
    if _SECRETS is None:
        raw = _read_fd(0)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - reads /dev/null now
        _SECRETS = marshal.loads(raw)  # written by the trusted parent
    return _SECRETS


def main():
    _prepare()
    size = _int.from_bytes(_read_fd(0, 8), "big")
    cfg = marshal.loads(_read_fd(0, size))  # the first document, written by the parent
    fd = cfg.pop("result_fd")
    if _FORKED:
        # What Popen(cwd=..., env=...) does for an exec-started runner.
        os.chdir(cfg["workdir"])
        env = cfg.pop("env")
        for key in _list(os.environ):  # (only what differs: fewer pages to copy)
            if key not in env:
                del os.environ[key]
        for key, value in env.items():
            if os.environ.get(key) != value:
                os.environ[key] = value
    check = _check_module() if cfg["mode"] == "check" else None  # (before the new root)
    info = _isolate(cfg, fd)
    if check is not None:
        # Nothing that holds the result pipe may be traced or read by the candidate's
        # process (``ptrace``, ``/proc/PID/mem``, ``/proc/PID/fd``): not dumpable.
        try:
            _libc().prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        except Exception:
            pass
    if info["pidns"]:
        _enter_pid_namespace()
    if check is not None:
        check.run_check(_SELF, cfg, fd, info)
    if cfg.get("single_process_bpf"):
        # No cgroup for this run: the program gets no processes beyond this one, so the
        # per-process limits bound the whole run.
        try:
            _install_filter(cfg["single_process_bpf"])
        except Exception as exc:
            _refuse(fd, info, f"the single-process filter was refused: {_short(exc)}")
    nonce = _secrets()["nonce"]
    _emit(fd, nonce, info)
    _run_exec(cfg, fd, nonce)


# ------------------------------------------------------------------ fork server
_FORKED = False  # True in a child forked by the fork server (set by _runner_fork_server.py)


def _load_sibling(name):
    """Load the runner's sibling file ``name``.py as a module (no sys.path needed)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_CHECK = None  # _runner_check.py, loaded for check runs (the fork server loads it up front)


def _check_module():
    """Load ``_runner_check.py`` (check mode: test and candidate processes) once."""
    global _CHECK
    if _CHECK is None:
        _CHECK = _load_sibling("_runner_check")
    return _CHECK


def _fork_server_module():
    """Load ``_runner_fork_server.py``, the fork server (only fork servers pay for compiling it)."""
    return _load_sibling("_runner_fork_server")


if __name__ == "__main__":
    if _len(sys.argv) in (3, 4) and sys.argv[1] == "--fork-server":
        _fork_server_module().run(
            _int(sys.argv[2]), _len(sys.argv) == 4 and sys.argv[3] == "--netns"
        )
    else:
        main()
