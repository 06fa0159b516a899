"""Child-side filesystem isolation of the sandbox runner: a new root, then no privileges.

Loaded by ``_runner.py`` (exec-started runners load it per run, a fork server once), never by
the trainer; only the standard library is used (the runner runs with ``-I -S``). Runs in
the runner after ``unshare(CLONE_NEWNS | ...)`` and before any model code.

:func:`enter_new_root` builds the program's root on a small tmpfs mounted on
``run_dir/root`` (a host directory only this run uses)::

    /<the interpreter, at the path sys.executable names>   read-only bind (one file)
    /<each sys.path directory that exists>                 read-only binds (stdlib)
    /<the directory of each shared library mapped now>     read-only binds (libc, ...)
    /<the ELF interpreter of the binary>, /etc/ld.so.cache  read-only (to exec python)
    /<readonly_paths given by the caller>                  read-only binds
    site-packages / dist-packages inside those             covered by empty read-only tmpfs
    /dev/{null,zero,full,random,urandom}                   binds of the host's nodes
    /tmp                                                   private tmpfs (mode 1777)
    <workdir>                                              private tmpfs (file_size_mb), the cwd

Symbolic links on the way to each path (``/lib -> usr/lib``, a venv's ``bin/python``)
are recreated as links, so every path means inside what it meant outside. Each bind is
re-mounted read-only, ``nosuid``, ``nodev`` (keeping the flags the kernel locks in a
user namespace), the root tmpfs too; then ``pivot_root`` and the old root is detached
(``chroot`` when ``pivot_root`` is refused). There is no ``/proc``, ``/sys``, ``/etc``
(but ``ld.so.cache``), ``/home`` or host ``/tmp``.

:func:`drop_privileges` then takes away every way back: a root trainer's program runs
as a user id of its own (``UID_BASE + pid``: no other process on the host has it, so
the program can signal or ptrace nothing, and ``RLIMIT_NPROC`` counts its processes
only); in a user namespace (non-root trainer) the program keeps the trainer's id but
loses all capabilities; ``PR_SET_NO_NEW_PRIVS`` either way.
"""

import ctypes
import os
import struct
import sys

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MS_STRICTATIME = 1 << 24
MNT_DETACH = 2
ST_NOEXEC = 8
ST_NOATIME = 1024
ST_NODIRATIME = 2048
ST_RELATIME = 4096
PR_SET_NO_NEW_PRIVS = 38
PR_CAPBSET_DROP = 24
PR_SET_PDEATHSIG = 1
CAP_VERSION_3 = 0x20080522
UID_BASE = 0x60000000  # + the runner's pid: a user id no real account has
_PIVOT_ROOT_NR = {
    "x86_64": 155,
    "aarch64": 41,
    "riscv64": 41,
    "ppc64le": 203,
    "ppc64": 203,
    "s390x": 217,
    "i686": 217,
    "i386": 217,
    "armv7l": 218,
}
_DEV_NODES = ("null", "zero", "full", "random", "urandom")
_TOP_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_BASE = None  # (binds, links) shared by every run of this process (a fork server: computed once)


class IsolationError(Exception):
    """The new root could not be built; the runner refuses to run the program."""


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return libc


_LIBC = None


def libc():
    """ctypes handle on the C library, with the prototypes this module uses."""
    global _LIBC
    if _LIBC is None:
        _LIBC = _libc()
    return _LIBC


def _check(ok, what):
    if not ok:
        err = ctypes.get_errno()
        raise IsolationError(f"{what}: {os.strerror(err)} (errno {err})")


def _mount(src, dst, fstype, flags, data=None):
    enc = os.fsencode
    rc = libc().mount(
        enc(src) if src is not None else None,
        enc(dst),
        enc(fstype) if fstype is not None else None,
        flags,
        enc(data) if data is not None else None,
    )
    _check(rc == 0, f"mount({src!r}, {dst!r}, {fstype!r}, {flags:#x})")


def _elf_interpreter(path):
    """The ``PT_INTERP`` of ELF file ``path`` (the dynamic loader), or ``None``."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
            if head[:4] != b"\x7fELF":
                return None
            is64, little = head[4] == 2, head[5] == 1
            e = "<" if little else ">"
            if is64:
                (phoff,) = struct.unpack_from(e + "Q", head, 32)
                phentsize, phnum = struct.unpack_from(e + "HH", head, 54)
            else:
                (phoff,) = struct.unpack_from(e + "I", head, 28)
                phentsize, phnum = struct.unpack_from(e + "HH", head, 42)
            for i in range(phnum):
                fh.seek(phoff + i * phentsize)
                ph = fh.read(phentsize)
                if struct.unpack_from(e + "I", ph, 0)[0] != 3:  # PT_INTERP
                    continue
                if is64:
                    (off,) = struct.unpack_from(e + "Q", ph, 8)
                    (size,) = struct.unpack_from(e + "Q", ph, 32)
                else:
                    (off,) = struct.unpack_from(e + "I", ph, 4)
                    (size,) = struct.unpack_from(e + "I", ph, 16)
                fh.seek(off)
                return fh.read(size).rstrip(b"\0").decode()
    except (OSError, struct.error, UnicodeDecodeError):
        return None
    return None


def _mapped_library_dirs():
    dirs = set()
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                parts = line.split(None, 5)
                if len(parts) == 6 and ".so" in parts[5]:
                    path = parts[5].strip()
                    if path.startswith("/") and os.path.isfile(path):
                        dirs.add(os.path.dirname(path))
    except OSError:
        pass
    return dirs


def _resolve(path, links, depth=0):
    """``path`` with every symlink component followed; links met go into ``links``.

    ``links`` maps a link's path to its target text (recreated as is in the new root).
    """
    if depth > 40:
        raise IsolationError(f"too many levels of symbolic links resolving {path!r}")
    parts = [p for p in path.split("/") if p and p != "."]
    cur = ""
    for i, name in enumerate(parts):
        if name == "..":
            cur = os.path.dirname(cur) if cur else ""
            continue
        nxt = cur + "/" + name
        if os.path.islink(nxt):
            target = os.readlink(nxt)
            links[nxt] = target
            base = target if target.startswith("/") else (cur or "") + "/" + target
            rest = "/".join(parts[i + 1 :])
            return _resolve(base + ("/" + rest if rest else ""), links, depth + 1)
        cur = nxt
    return cur or "/"


def base_plan():
    """What every run of this interpreter needs: ``(binds, links)``, computed once.

    ``binds`` are real host paths (no symlink components) to bind read-only at the same
    path; ``links`` are the symlinks on the way there.
    """
    global _BASE
    if _BASE is not None:
        return _BASE
    links = {}
    wanted = [sys.executable]
    wanted += [p for p in sys.path if p and os.path.isdir(p)]
    wanted += sorted(_mapped_library_dirs())
    interp = _elf_interpreter(os.path.realpath(sys.executable))
    if interp:
        wanted.append(interp)
    if os.path.isfile("/etc/ld.so.cache"):
        wanted.append("/etc/ld.so.cache")
    for top in _TOP_LINKS:  # the loader's cache names /lib/... on merged-/usr systems
        if os.path.islink(top):
            _resolve(top, links)
    binds = _dedupe(_resolve(p, links) for p in wanted if os.path.exists(p))
    masks = []
    for path in sys.path:
        for name in ("site-packages", "dist-packages"):
            cand = os.path.join(path, name)
            if os.path.isdir(cand):
                masks.append(os.path.realpath(cand))
    _BASE = (binds, links, masks)
    return _BASE


def _dedupe(paths):
    """Sorted paths without those inside another (a bound directory shows them already)."""
    out = []
    for path in sorted(set(paths), key=lambda p: (p.count("/"), p)):
        if not any(path == d or path.startswith(d.rstrip("/") + "/") for d in out):
            out.append(path)
    return sorted(out)


def _placeholder(root, path, is_dir):
    """Create ``root + path`` (directory or empty file) and its parents in the new root."""
    target = root + path
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    if is_dir:
        os.makedirs(target, exist_ok=True)
    elif not os.path.exists(target):
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT, 0o644))
    return target


def _make_link(root, link, target):
    inside = root + link
    if os.path.lexists(inside):
        return
    os.makedirs(os.path.dirname(inside), exist_ok=True)
    os.symlink(target, inside)


def _locked_flags(path):
    """Flags of the mount holding ``path`` that a remount in a user namespace must keep."""
    try:
        f = os.statvfs(path).f_flag
    except OSError:
        return 0
    flags = 0
    if f & ST_NOEXEC:
        flags |= MS_NOEXEC
    if f & ST_NOATIME:
        flags |= MS_NOATIME
    if f & ST_NODIRATIME:
        flags |= MS_NODIRATIME
    if f & ST_RELATIME:
        flags |= MS_RELATIME
    return flags


def _bind(src, dst, readonly):
    try:
        _mount(src, dst, None, MS_BIND)
    except IsolationError:
        # A directory with mounts under it that the kernel locked (user namespace) can
        # only be bound with them.
        _mount(src, dst, None, MS_BIND | MS_REC)
    flags = MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | _locked_flags(src)
    if readonly:
        flags |= MS_RDONLY
    _mount(None, dst, None, flags)


def _pivot(root):
    """Make ``root`` the root of this mount namespace; ``"pivot_root"`` or ``"chroot"``."""
    os.chdir(root)
    nr = _PIVOT_ROOT_NR.get(os.uname().machine)
    if nr is not None and libc().syscall(nr, b".", b".") == 0:
        # The old root is now stacked on "."; detach it (and everything under it).
        _check(libc().umount2(b".", MNT_DETACH) == 0, "umount2(old root)")
        os.chdir("/")
        return "pivot_root"
    os.chroot(".")  # e.g. the runner already lives in a chroot: pivot_root says EINVAL
    os.chdir("/")
    return "chroot"


def enter_new_root(cfg, info):
    """Build the program's root (see the module docs) and move into it.

    Must run in a new mount namespace, with ``CAP_SYS_ADMIN`` there. Changes the working
    directory to ``cfg["workdir"]`` (same path inside). Records ``fs_root`` and
    ``missing_paths`` in ``info``.

    Raises:
        IsolationError: a mount that the isolation depends on failed.
    """
    binds, links, masks = base_plan()
    links = dict(links)
    extra = []
    missing = []
    for path in cfg.get("readonly_paths") or ():
        if os.path.exists(path):
            extra.append(_resolve(path, links))
        else:
            missing.append(path)
    if extra:
        binds = _dedupe(list(binds) + extra)
    workdir = cfg["workdir"]
    root = os.path.join(cfg["run_dir"], "root")
    os.makedirs(root, exist_ok=True)
    # Nothing we mount may propagate back to the host's mount namespace.
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=4096,mode=0755")
    size_mb = cfg["limits"].get("file_size_mb") or 16
    _placeholder(root, "/tmp", True)
    _mount(
        "tmpfs",
        root + "/tmp",
        "tmpfs",
        MS_NOSUID | MS_NODEV,
        f"size={int(size_mb)}m,nr_inodes=4096,mode=1777",
    )
    for name in _DEV_NODES:
        src = "/dev/" + name
        if os.path.exists(src):
            _mount(src, _placeholder(root, src, False), None, MS_BIND)
    for link, target in links.items():
        _make_link(root, link, target)
    for path in binds:
        _bind(path, _placeholder(root, path, os.path.isdir(path)), readonly=True)
    for path in sorted(set(masks) | set(cfg.get("mask_paths") or ())):
        if os.path.isdir(path) and any(path.startswith(b.rstrip("/") + "/") for b in binds):
            _mount(
                "tmpfs",
                root + path,
                "tmpfs",
                MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                "size=4k,nr_inodes=1,mode=0755",
            )
    # The work directory is a size-capped tmpfs of its own (not the host directory): what
    # a program writes there is bounded (ENOSPC past it) and is gone with the namespace.
    _mount(
        "tmpfs",
        _placeholder(root, workdir, True),
        "tmpfs",
        MS_NOSUID | MS_NODEV,
        f"size={int(size_mb)}m,nr_inodes=4096,mode=0700",
    )
    _mount(None, root, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    info["fs_root"] = _pivot(root)
    os.chdir(workdir)
    if missing:
        info["missing_paths"] = missing


def effective_capabilities():
    """This process's effective capability mask (``capget``), ``-1`` if unknown."""
    header = (ctypes.c_uint32 * 2)(CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    if libc().capget(header, data) != 0:
        return -1
    return data[0] | (data[3] << 32)


def drop_privileges(info, in_userns, forked):
    """Leave no privilege to the program (see the module docs); records ``uid``.

    ``in_userns``: this runner made a user namespace (non-root trainer). ``forked``: a
    fork server's child, whose parent-death signal the kernel clears on a uid change and that
    is set again here.

    Raises:
        IsolationError: the privileges could not be dropped.
    """
    lc = libc()
    # The bounding set first (needs CAP_SETPCAP, which the uid switch below takes away).
    for cap in range(64):
        if lc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == 22:
            break  # EINVAL: past the last capability this kernel knows
    if not in_userns and os.geteuid() == 0:
        uid = UID_BASE + os.getpid()
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)  # from 0 to non-zero: every capability goes
        except OSError as exc:
            if exc.errno not in (1, 22) or os.getuid() != 0:
                raise IsolationError(f"could not switch to user id {uid}: {exc}") from None
            # EINVAL / EPERM: the trainer is "root" of a user namespace that maps no
            # other id or denies setgroups (e.g. ``unshare -r``); host-wise it is an
            # unprivileged user already. Dropping the capabilities below is what is left.
            info["uid_switch"] = False
    # Whatever capabilities are left (a user namespace's creator has all of them there).
    header = (ctypes.c_uint32 * 2)(CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(lc.capset(header, data) == 0, "capset(0)")
    _check(lc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0, "prctl(PR_SET_NO_NEW_PRIVS)")
    if forked:
        lc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
    info["uid"] = os.geteuid()
    info["capabilities"] = effective_capabilities()
