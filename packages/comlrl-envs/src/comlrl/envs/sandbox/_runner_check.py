"""Check mode of the sandbox runner: the tests and the candidate in two processes.

Loaded by ``_runner.py`` (``python -I -S -B``) through ``_load_sibling``; only the
standard library. A check run is two processes inside the same sandbox:

- the **test process** T (the runner itself) holds the result pipe and the nonce, reads
  the test plan, runs every test statement, and writes the verdict. No model-written
  code ever runs in T: T never executes the program.
- the **candidate process** C, forked from T *before* T has read the test plan and the
  nonce (they arrive on stdin after the fork, see ``_process.encode_instructions``), closes
  the result pipe and stdin, loads the program, and then only answers T's requests on a
  private pipe pair: call this function, get that attribute, iterate this object.

What crosses from C to T is data: ``marshal`` bytes that T decodes and accepts only when
every value is exactly ``None``/``bool``/``int``/``float``/``complex``/``str``/``bytes``
or a ``tuple``/``list``/``dict``/``set``/``frozenset`` of such values (checked with
``type(x) is ...``, recursively). Any other object stays in C; T gets an opaque
:class:`_Remote` handle to it, which can be called, iterated, indexed, printed and have
attributes read or set (each a request to C), but which refuses ``==``, ``!=``, ordering
and arithmetic (the unit raises ``TypeError`` and fails). Membership (``x in handle``,
``assertIn``) is decided in T over the items the object's iteration yields, with T's own
``==``; truth by Python's rule decided in T (true, or its ``len`` when its class defines
``__len__``; a class with its own ``__bool__`` is refused); ``isinstance``/``issubclass``
by the class's MRO, not a metaclass's answer. So no dunder of the program (``__eq__``,
``__contains__``, ``__bool__``, ``__instancecheck__`` ...) answers a test's question: every
comparison a test makes is between plain values built by T itself, with T's own
(unpatched) ``==``, ``abs``, ``math``... A program cannot answer a comparison, patch what the tests use, reach the
tests' frames or source, or write to the result pipe: all of that lives in T.

T is not dumpable (``PR_SET_DUMPABLE`` 0, set before the fork), so C cannot ``ptrace``
it, read its memory or open its descriptors through ``/proc``. C may crash, exit, hang or
kill T: every one of those ends without a verdict or with the units failed.

Names the test uses that it does not define itself (a program-level helper, a class the
test constructs) are looked up in C's namespace: modules are imported afresh in T (a
program cannot hand the tests a patched ``math``), plain values are copied, anything
else becomes a :class:`_Remote`. Which names are bound is decided in T (the parent's list
of the test's free names, less T's own builtins): builtins always come from T, whatever C
reports.

Every phase runs on T's timer: the load (``load_timeout_s``, else the unit budget), each
unit, the final call counts; C that does not answer in time is killed. A program that
stops T (``SIGSTOP``) is seen by the PID namespace's init, which kills T: the run ends
at once without a verdict instead of holding its wall clock.
"""

import builtins
import marshal
import os
import sys

# Module-level names win over builtins: the candidate's process keeps working (and the
# test process does not care) when a program rebinds or clears ``builtins``.
from builtins import (  # noqa: A004, UP029
    BaseException,
    Ellipsis,
    Exception,
    OverflowError,
    RuntimeError,
    TypeError,
    ValueError,
    any,
    bytearray,
    bytes,
    dict,
    enumerate,
    frozenset,
    getattr,
    id,
    int,
    isinstance,
    issubclass,
    iter,
    len,
    list,
    max,
    object,
    repr,
    set,
    setattr,
    str,
    tuple,
    type,
)

_R = None  # the _runner module (set by run_check)
_MAX_MESSAGE = 32 * 1024 * 1024  # largest frame either side accepts
_MAX_DEPTH = 200  # nesting of a value crossing the pipe
_GRACE_S = 0.25  # T waits this much past a unit's budget before it stops C
_PLAIN_ATOMS = (type(None), bool, int, float, complex, str, bytes)
_FORWARDED_DUNDERS = ("__name__", "__qualname__", "__doc__", "__module__", "__dict__")
PR_SET_DUMPABLE = 4


class _Tampered(Exception):
    """C broke the protocol (a frame or value our own C code never sends)."""


class _CandidateGone(Exception):
    """C ended (exited, crashed, or was stopped after a timeout)."""


class _CallTimeout(BaseException):
    """Raised in C by its own timer when one call runs past the unit's budget."""


class CandidateError(Exception):
    """An exception raised in the candidate process whose type is not a builtin."""


# ---------------------------------------------------------------------- framing
def _send(fd, obj):
    data = marshal.dumps(obj)
    data = len(data).to_bytes(4, "big") + data
    while data:
        data = data[os.write(fd, data) :]


_BUFFERS: dict[int, bytes] = {}  # fd -> bytes read past the last frame


def _fill(fd, buf, n):
    """``buf`` (a bytearray) grown to at least ``n`` bytes from ``fd``; ``None`` at EOF."""
    while len(buf) < n:
        chunk = os.read(fd, max(1 << 16, n - len(buf)))
        if not chunk:
            return None
        buf.extend(chunk)
    return buf


def _recv(fd):
    """One frame's bytes, or ``None`` at EOF. Raises ``_Tampered`` on a bad length."""
    buf = _fill(fd, _BUFFERS.pop(fd, None) or bytearray(), 4)
    if buf is None:
        return None
    n = int.from_bytes(buf[:4], "big")
    if n > _MAX_MESSAGE:
        raise _Tampered(f"frame of {n} bytes")
    buf = _fill(fd, buf, 4 + n)
    if buf is None:
        return None
    _BUFFERS[fd] = buf[4 + n :]
    return bytes(buf[4 : 4 + n])


_PLAIN_BASES = (bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset)
_REBUILT = ("deque", "decimal", "fraction", "datetime", "date", "time", "timedelta")
_DATETIME_FIELDS = {
    "datetime": ("year", "month", "day", "hour", "minute", "second", "microsecond"),
    "date": ("year", "month", "day"),
    "time": ("hour", "minute", "second", "microsecond"),
}


def _special(x, t):
    """``(kind, plain payload)`` for the stdlib values rebuilt on the other side."""
    where = (getattr(t, "__module__", None), getattr(t, "__qualname__", None))
    if where == ("collections", "deque"):
        return "deque", (list(x), x.maxlen)
    if where == ("decimal", "Decimal"):
        return "decimal", str(x)
    if where == ("fractions", "Fraction"):
        return "fraction", (int(x.numerator), int(x.denominator))
    if where[0] == "datetime" and where[1] in _DATETIME_FIELDS and x.tzinfo is None:
        return where[1], tuple(int(getattr(x, f)) for f in _DATETIME_FIELDS[where[1]])
    if where == ("datetime", "timedelta"):
        return "timedelta", (int(x.days), int(x.seconds), int(x.microseconds))
    return None


def _module_path(x):
    """``(module, qualname)`` naming the callable ``x`` (``datetime.now``), when that
    path leads back to ``x`` in this process; else ``None``."""
    if not callable(x) or isinstance(x, type(sys)):
        return None
    owner = getattr(x, "__self__", None)
    module = getattr(x, "__module__", None) or getattr(owner, "__module__", None)
    qualname = getattr(x, "__qualname__", None)
    if type(module) is not str or type(qualname) is not str or "<" in qualname:
        return None
    try:
        found = _resolve_path((module, qualname))
        return (module, qualname) if found is x or found == x else None
    except Exception:
        return None


def _resolve_path(path):
    """The object at ``module.qualname`` (imported here)."""
    module, qualname = path
    __import__(module)
    obj = sys.modules[module]
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _rebuild(kind, payload):
    """The value ``_special`` described, built from plain data with this process's stdlib."""
    if kind == "deque":
        import collections

        items, maxlen = payload
        return collections.deque(items, maxlen)
    if kind == "decimal":
        import decimal

        return decimal.Decimal(payload)
    if kind == "fraction":
        import fractions

        return fractions.Fraction(*payload)
    if kind in _DATETIME_FIELDS or kind == "timedelta":
        import datetime

        if type(payload) is not tuple or any(type(v) is not int for v in payload):
            raise ValueError(kind)
        return getattr(datetime, kind)(*payload)
    raise ValueError(kind)


# ------------------------------------------------------------ candidate process
def _serve(cfg, code, rfd, wfd, tag):
    """C: load the program, then answer T's requests until EOF (never returns)."""
    refs = {}
    ids = {}

    def ref(obj):
        key = id(obj)
        if key not in ids:
            ids[key] = len(refs)
            refs[len(refs)] = obj
        return (tag, ids[key])

    pristine = _R._PRISTINE_BUILTINS

    def _lineage(cls):
        """``[(handle key, name, [base names or keys])]`` of the program's classes in the
        exception class ``cls``'s MRO (builtin bases by name), so T can rebuild them."""
        out = []
        try:
            for klass in cls.__mro__:
                if pristine.get(klass.__name__) is klass:
                    continue
                bases = [
                    b.__name__ if pristine.get(b.__name__) is b else ref(b)[1]
                    for b in klass.__bases__
                ]
                out.append((ref(klass)[1], str(klass.__name__), bases))
        except BaseException:
            return []
        return out

    def enc(x, depth=0):
        t = type(x)
        if t in _PLAIN_ATOMS or x is Ellipsis:
            return x
        if t is TestsCallable:
            return (tag, "t", x.key)
        if depth > _MAX_DEPTH:
            return ref(x)
        if t is list:
            return [enc(i, depth + 1) for i in x]
        if t is tuple:
            return tuple(enc(i, depth + 1) for i in x)
        if t is dict:
            return {enc(k, depth + 1): enc(v, depth + 1) for k, v in x.items()}
        if t is set or t is frozenset:
            return t(enc(i, depth + 1) for i in x)
        if t is type and pristine.get(x.__name__) is x:
            return (tag, "type", x.__name__)
        if isinstance(x, type) and issubclass(x, BaseException):
            return (tag, "exc", _lineage(x))
        special = _special(x, t)
        if special is not None:
            return (tag, special[0], enc(special[1], depth + 1))
        for base in _PLAIN_BASES:  # a subclass (namedtuple, Counter, IntEnum...): its data
            if isinstance(x, base):
                return enc(base(x), depth)
        return ref(x)

    callbacks = {}  # key -> C's stand-in for T's callable; 0 -> call_back (below)

    class TestsCallable:
        """C's stand-in for a callable of the tests (``MagicMock``, a function): calling
        it asks T to run it."""

        __slots__ = ("key",)

        def __init__(self, key):
            self.key = key

        def __call__(self, *args, **kwargs):
            return callbacks[0](self.key, args, kwargs)

    def live(x, depth=0):
        """``enc`` for an attribute's value: each list/dict/set (subclasses too) also
        carries its handle key, so T can write its changes back into this very object."""
        if depth <= _MAX_DEPTH:
            for base, kind in ((list, "list"), (dict, "dict"), (set, "set")):
                if isinstance(x, base):
                    if base is dict:
                        items = [(enc(k, depth + 1), live(v, depth + 1)) for k, v in x.items()]
                    else:
                        items = [live(v, depth + 1) for v in x]
                    return (tag, "live", (ref(x)[1], kind, items))
        return enc(x, depth)

    def dec(x):
        t = type(x)
        if t is tuple:
            if len(x) >= 2 and type(x[0]) is bytes and x[0] == tag:
                if len(x) == 2:
                    return refs[x[1]]
                if x[1] == "type":
                    return pristine[x[2]]
                if x[1] == "path":
                    return _resolve_path(x[2])
                if x[1] == "t":
                    if x[2] not in callbacks:
                        callbacks[x[2]] = TestsCallable(x[2])
                    return callbacks[x[2]]
                if x[1] == "xml":
                    import xml.etree.ElementTree as ET

                    return ET.fromstring(x[2])
                return _rebuild(x[1], dec(x[2]))
            return tuple(dec(i) for i in x)
        if t is list:
            return [dec(i) for i in x]
        if t is dict:
            return {dec(k): dec(v) for k, v in x.items()}
        if t is set or t is frozenset:
            return t(dec(i) for i in x)
        return x

    out, err = sys.stdout, sys.stderr  # the program may rebind sys.stdout

    def flush():
        for stream in (out, err):
            try:
                stream.flush()
            except BaseException:
                pass

    ns = {"__name__": "__candidate__", "__builtins__": builtins}
    try:
        _R._exec(code, ns)
    except _R._SystemExit:
        raise  # exiting while loading ends the run without a verdict
    except _R._BaseException as exc:
        flush()
        _send(wfd, ("load_error", _R._short(exc)))
        _R._exit(0)
    entry = ns.get(cfg["entry_point"])
    if not _R._callable(entry):
        flush()
        _send(
            wfd, ("load_error", f"entry point {cfg['entry_point']!r} is not defined as a function")
        )
        _R._exit(0)
    counter = {}
    for name in cfg.get("track_calls", []):
        fn = ns.get(name)
        if _R._callable(fn):
            ns[name] = _R._counting(fn, counter, name)
    flush()
    found = {}  # the test's free names that the program defines (sent with "loaded")
    for name in cfg.get("names", ()):
        if name in ns and name != "__builtins__" and name not in pristine:
            obj = ns[name]
            if type(obj) is type(sys):
                found[name] = ("m", getattr(obj, "__name__", ""))
            else:
                found[name] = ("v", enc(obj))
    _send(wfd, ("loaded", ref(ns[cfg["entry_point"]])[1], found))

    def on_alarm(signum, frame):
        raise _CallTimeout()

    try:
        _R._signal(_R.signal.SIGALRM, on_alarm)  # per-call budgets (a program may replace it)
    except BaseException:
        pass

    def handle(op, args):
        """The reply to one request of T."""
        budget = args[-1]
        encode = live if op == "getlive" else enc
        try:
            if budget:
                _R._setitimer(_R.signal.ITIMER_REAL, budget)
            target = refs[args[0]]
            if op == "call":
                value = target(*dec(args[1]), **dec(args[2]))
            elif op == "callwb":
                pos, kw = dec(args[1]), dec(args[2])
                value = target(*pos, **kw)
                # T's own lists/dicts/sets the call changed in place: their new contents
                changed = [
                    (i, enc(a))
                    for i, a in enumerate(pos)
                    if type(a) in (list, dict, set) and enc(a) != args[1][i]
                ]
                changed += [
                    (k, enc(a))
                    for k, a in kw.items()
                    if type(a) in (list, dict, set) and enc(a) != args[2][k]
                ]
            elif op == "getattr" or op == "getlive":
                value = getattr(target, args[1])
            elif op == "setattr":
                setattr(target, args[1], dec(args[2]))
                value = None
            elif op == "iter":
                value = list(target)
            elif op == "len":
                value = len(target)
            elif op == "replace":  # T changed its copy of a list/dict/set: same object here
                items = dec(args[1])
                if isinstance(target, list):
                    target[:] = items
                else:
                    target.clear()
                    target.update(items)
                value = None
            elif op == "setitem":
                target[dec(args[1])] = dec(args[2])
                value = None
            elif op == "delitem":
                del target[dec(args[1])]
                value = None
            elif op == "truth":  # which of Python's truth rules applies (no call into it)
                mro = type.__getattribute__(type(target), "__mro__")
                own = [k for k in mro if k is not object]
                if any("__bool__" in type.__getattribute__(k, "__dict__") for k in own):
                    value = "bool"
                elif any("__len__" in type.__getattribute__(k, "__dict__") for k in own):
                    value = "len"
                else:
                    value = "none"
            elif op == "isinstance":  # by the class's MRO, not a metaclass's answer
                value = _in_mro(target, type(dec(args[1])))
            elif op == "issubclass":
                value = _in_mro(target, dec(args[1]))
            elif op == "getitem":
                value = target[dec(args[1])]
            elif op == "str":
                value = str(target)
            elif op == "repr":
                value = repr(target)
            else:
                raise ValueError(f"unknown request {op!r}")
            _R._setitimer(_R.signal.ITIMER_REAL, 0)
            return ("ok", encode(value)) if op != "callwb" else ("ok", enc(value), changed)
        except _CallTimeout:
            return ("timeout", budget)
        except _R._BaseException as exc:
            try:
                _R._setitimer(_R.signal.ITIMER_REAL, 0)
            except _R._BaseException:
                pass
            return ("raise", _R._type(exc).__name__, _R._short(exc), _lineage(_R._type(exc)))

    def next_request():
        """The next ``(op, args)`` from T; exits at EOF or on a bad frame."""
        try:
            raw = _recv(rfd)
        except _Tampered:
            _R._exit(1)
        if raw is None:
            flush()
            _R._exit(0)
        return marshal.loads(raw)

    def answer(op, args):
        if op == "stats":
            reply = ("ok", {str(k): int(v) for k, v in counter.items()})
        else:
            reply = handle(op, args)
        flush()
        try:
            _send(wfd, reply)
        except (ValueError, TypeError, OverflowError):  # unmarshallable, too deep
            _send(wfd, ("raise", "ValueError", "the value could not be sent to the tests", []))

    def call_back(key, args, kwargs):
        """Call T's object ``key`` (one the tests passed in): T runs it and answers;
        requests T makes meanwhile are served here."""
        _send(wfd, ("callback", key, enc(args), enc(kwargs)))
        while True:
            op, reply = next_request()
            if op == "cb_ok":
                return dec(reply[0])
            if op == "cb_raise":
                cls = pristine.get(reply[0])
                if not (isinstance(cls, type) and issubclass(cls, Exception)):
                    cls = RuntimeError
                raise cls(reply[1])
            answer(op, reply)

    callbacks[0] = call_back
    while True:
        answer(*next_request())


def _in_mro(cls, sub):
    """Whether ``cls`` is in ``sub.__mro__`` (identity; ``False`` when ``sub`` is no class)."""
    if not isinstance(sub, type) or not isinstance(cls, type):
        return False
    return any(k is cls for k in type.__getattribute__(sub, "__mro__"))


# ----------------------------------------------------------------- test process
class _Client:
    """T's end of the pipe pair to C."""

    def __init__(self, pid, wfd, rfd, tag, builtins_dict):
        self.pid, self.wfd, self.rfd, self.tag = pid, wfd, rfd, tag
        self.remotes = {}
        self.exceptions = {}  # C's handle key -> T's stand-in exception class
        self.builtins = builtins_dict
        self.dead = None  # why C can no longer answer
        self.exited = None  # C's wait status when it ended on its own
        self.deadline = None  # monotonic end of the current unit's budget
        self.waiting = False  # T is writing to or waiting on C
        self.timed_out = False  # a request ran past the unit's budget (C was stopped)
        self.sent = ((), {})  # T's own arguments of the call in flight
        # Inside a unittest test (ClassEval): attribute reads are live containers and a
        # call's in-place changes to T's arguments come back, as in one process. Plain
        # check units (HumanEval, MBPP) keep copies: a program cannot touch their values.
        self.unittest_mode = False
        self.t_objects = {}  # key -> a callable of the tests handed to C (C may call it)
        self.t_keys = {}  # id -> key (the objects stay alive in t_objects)
        self.labels = {}  # handle key -> the name the tests reached it by (for feedback)
        self.last_call = None  # (label, args, kwargs, ok, value or exception) of this unit
        self.failure_call = None  # last_call when a unittest test failed (before tearDown)

    def stop(self, why):
        if self.dead is None:
            self.dead = why
            try:
                os.kill(self.pid, 9)
            except OSError:
                pass

    def remote(self, key):
        if key not in self.remotes:
            self.remotes[key] = _Remote(self, key)
        return self.remotes[key]

    def to_wire(self, x, depth=0):
        t = type(x)
        if t in _PLAIN_ATOMS or x is Ellipsis:
            return x
        if t is _Remote:
            return (self.tag, object.__getattribute__(x, "_key"))
        if t in _LIVE_TYPES:  # C's own list/dict/set, as is (a copy of one: its data)
            key = getattr(x, "_comlrl_key", None)
            if type(key) is int:
                return (self.tag, key)
            plain = list(x) if isinstance(x, list) else dict(x) if isinstance(x, dict) else set(x)
            return self.to_wire(plain, depth)
        if self.builtins.get(getattr(x, "__name__", None)) is x:
            return (self.tag, "type", x.__name__)  # a builtin function (len, max, ...)
        path = _module_path(x)
        if path is not None:  # a module-level function/method of the stdlib, by name
            return (self.tag, "path", path)
        where = (getattr(t, "__module__", None), getattr(t, "__qualname__", None))
        if where == ("xml.etree.ElementTree", "Element"):  # as its XML text
            import xml.etree.ElementTree as ET

            return (self.tag, "xml", ET.tostring(x, encoding="unicode"))
        if callable(x) and t is not type:  # the tests' own callable (a MagicMock): by key
            key = self.t_keys.get(id(x))
            if key is None:
                key = self.t_keys[id(x)] = len(self.t_objects) + 1
                self.t_objects[key] = x
            return (self.tag, "t", key)
        if depth > _MAX_DEPTH:
            raise ValueError("argument nested too deeply to send to the candidate")
        if t is list:
            return [self.to_wire(i, depth + 1) for i in x]
        if t is tuple:
            return tuple(self.to_wire(i, depth + 1) for i in x)
        if t is dict:
            return {self.to_wire(k, depth + 1): self.to_wire(v, depth + 1) for k, v in x.items()}
        if t is set or t is frozenset:
            return t(self.to_wire(i, depth + 1) for i in x)
        if t is type and self.builtins.get(x.__name__) is x:
            return (self.tag, "type", x.__name__)
        special = _special(x, t)
        if special is not None:
            return (self.tag, special[0], self.to_wire(special[1], depth + 1))
        raise TypeError(f"a {t.__name__} cannot be passed to the candidate's process")

    def from_wire(self, x, depth=0):
        t = type(x)
        if t in _PLAIN_ATOMS or x is Ellipsis:
            return x
        if depth > _MAX_DEPTH:
            raise _Tampered("value nested too deeply")
        if t is tuple:
            if len(x) >= 2 and type(x[0]) is bytes and x[0] == self.tag:
                return self._tagged(x, depth)
            return tuple(self.from_wire(i, depth + 1) for i in x)
        if t is list:
            return [self.from_wire(i, depth + 1) for i in x]
        if t is dict:
            return {
                self.from_wire(k, depth + 1): self.from_wire(v, depth + 1) for k, v in x.items()
            }
        if t is set or t is frozenset:
            return t(self.from_wire(i, depth + 1) for i in x)
        raise _Tampered(f"a {t.__name__} crossed the pipe")

    def _tagged(self, x, depth):
        """A tagged tuple from C: a handle, a builtin type, or a rebuilt stdlib value."""
        if len(x) == 2 and type(x[1]) is int:
            return self.remote(x[1])
        if len(x) == 3 and x[1] == "type" and type(x[2]) is str:
            cls = self.builtins.get(x[2])
            if type(cls) is type:
                return cls
        if len(x) == 3 and x[1] == "live" and type(x[2]) is tuple and len(x[2]) == 3:
            key, kind, items = x[2]
            if type(key) is int and type(items) is list and kind in _LIVE:
                if kind == "dict":
                    pairs = []
                    for pair in items:
                        if type(pair) is not tuple or len(pair) != 2:
                            raise _Tampered("bad live dict")
                        pairs.append(
                            (self.from_wire(pair[0], depth + 1), self.from_wire(pair[1], depth + 1))
                        )
                    return _LIVE[kind](self, key, pairs)
                return _LIVE[kind](self, key, [self.from_wire(i, depth + 1) for i in items])
        if len(x) == 3 and x[1] == "t" and type(x[2]) is int and x[2] in self.t_objects:
            return self.t_objects[x[2]]
        if len(x) == 3 and x[1] == "exc":
            cls = self.exception_class(x[2])
            if cls is not None:
                return cls
        if len(x) == 3 and x[1] in _REBUILT:
            try:
                return _rebuild(x[1], self.from_wire(x[2], depth + 1))
            except (TypeError, ValueError, ArithmeticError):
                pass
        raise _Tampered("bad tagged value")

    def write_back(self, changed):
        """Put the new contents C reported into T's list/dict/set arguments of the call
        in flight (the program changed them in place, as the tests may expect)."""
        pos, kw = self.sent
        for where, data in changed:
            if type(where) is int and 0 <= where < len(pos):
                arg = pos[where]
            elif type(where) is str:
                arg = kw.get(where)
            else:
                raise _Tampered("bad write-back")
            new = self.from_wire(data)
            if type(arg) is list and type(new) is list:
                arg[:] = new
            elif type(arg) in (dict, set) and type(new) is type(arg):
                arg.clear()
                arg.update(new)

    def exception_class(self, lineage):
        """T's stand-in for one of the program's exception classes: a subclass of
        :class:`CandidateError` (and of the builtin exception bases the program's class
        names), one per class of the program, with the program's hierarchy. ``None`` for a
        malformed ``lineage``. Only which ``except`` clauses match depends on it."""
        if type(lineage) is not list or not lineage:
            return None
        for entry in reversed(lineage):  # bases first
            if type(entry) is not tuple or len(entry) != 3:
                return None
            key, name, bases = entry
            if type(key) is not int or type(name) is not str or type(bases) is not list:
                return None
            if key in self.exceptions:
                continue
            parents = []
            for b in bases:
                if type(b) is str:
                    cls = self.builtins.get(b)
                    if isinstance(cls, type) and issubclass(cls, Exception):
                        parents.append(cls)
                elif type(b) is int and b in self.exceptions:
                    parents.append(self.exceptions[b])
            parents = [p for p in parents if p is not Exception and p is not BaseException]
            if not any(issubclass(p, CandidateError) for p in parents):
                parents.append(CandidateError)
            try:
                self.exceptions[key] = type(name, tuple(parents), {"__module__": "candidate"})
            except TypeError:  # an impossible layout: the stand-in without those bases
                self.exceptions[key] = type(name, (CandidateError,), {"__module__": "candidate"})
        head = lineage[0][0]
        return self.exceptions.get(head)

    def reply(self):
        """The next decoded frame from C (a tuple) that is not a call back of one of the
        tests' callables (those are run here, in T, and answered), or raise
        ``_CandidateGone``."""
        while True:
            msg = self._frame()
            if msg[0] != "callback":
                return msg
            if len(msg) != 4 or type(msg[1]) is not int or msg[1] not in self.t_objects:
                raise _Tampered("bad call back")
            args, kwargs = self.from_wire(msg[2]), self.from_wire(msg[3])
            if type(args) is not tuple or type(kwargs) is not dict:
                raise _Tampered("bad call back")
            try:
                out = ("cb_ok", (self.to_wire(self.t_objects[msg[1]](*args, **kwargs)),))
            except (_Tampered, _CandidateGone, _R._UnitTimeout):
                raise
            except Exception as exc:
                out = ("cb_raise", (type(exc).__name__, _R._short(exc)))
            _send(self.wfd, out)

    def _frame(self):
        if self.dead is not None:
            raise _CandidateGone(self.dead)
        raw = _recv(self.rfd)
        if raw is None:
            self.exited = _R._wait_for(self.pid)
            self.dead = "the candidate's process ended"
            raise _CandidateGone(self.dead)
        try:
            msg = marshal.loads(raw)
        except Exception:
            raise _Tampered("undecodable frame") from None
        if type(msg) is not tuple or not msg or type(msg[0]) is not str:
            raise _Tampered("malformed frame")
        return msg

    def request(self, op, *args):
        budget = 0.0
        if self.deadline is not None:
            budget = self.deadline - _monotonic()
            if budget <= 0:
                raise _R._UnitTimeout()
        if self.dead is not None:
            raise _CandidateGone(self.dead)
        self.waiting = True
        try:
            _send(self.wfd, (op, (*args, budget)))
            msg = self.reply()
        except OSError:
            raise _CandidateGone("the candidate's process ended") from None
        except _R._UnitTimeout:
            # T's own timer fired while C owed an answer: C is stopped (a late answer
            # would be taken for the next request's), the unit times out.
            self.timed_out = True
            self.stop("stopped after a test unit timed out")
            raise
        self.waiting = False
        kind = msg[0]
        if kind == "ok" and len(msg) == 2:
            return self.from_wire(msg[1])
        if kind == "ok" and len(msg) == 3 and op == "callwb" and type(msg[2]) is list:
            self.write_back(msg[2])
            return self.from_wire(msg[1])
        if kind == "timeout":
            raise _R._UnitTimeout()
        if kind == "raise" and len(msg) == 4 and type(msg[1]) is str and type(msg[2]) is str:
            cls = self.exception_class(msg[3])
            if cls is not None:
                raise cls(msg[2])
            raise _exception(self.builtins, msg[1], msg[2])
        raise _Tampered(f"unexpected reply {kind!r}")


def _monotonic():
    import time

    return time.monotonic()


def _exception(bdict, name, message):
    """The exception T raises for one that C reported (a builtin type when it is one)."""
    cls = bdict.get(name)
    if isinstance(cls, type) and issubclass(cls, BaseException):
        try:
            return cls(message[len(name) + 2 :] if message.startswith(name + ": ") else message)
        except Exception:
            pass
    return CandidateError(message)


def _live_class(base, mutators):
    """A ``base`` subclass for T's copy of one of C's containers: each mutating method
    changes the copy, then writes its new contents back into C's object (``replace``)."""

    def init(self, client, key, items):
        base.__init__(self, items)
        self._comlrl_client, self._comlrl_key = client, key

    def push(self):
        client = getattr(self, "_comlrl_client", None)
        if client is None:  # a copy (copy.deepcopy, pickle) is T's own
            return
        data = base(self) if base is not dict else dict(self)
        client.request("replace", self._comlrl_key, client.to_wire(data))

    def wrap(name):
        method = getattr(base, name)

        def mutator(self, *args, **kwargs):
            out = method(self, *args, **kwargs)
            push(self)
            return self if name.startswith("__i") else out

        mutator.__name__ = name
        return mutator

    attrs = {"__init__": init, "__slots__": ("_comlrl_client", "_comlrl_key")}
    attrs.update({name: wrap(name) for name in mutators if hasattr(base, name)})
    return type(base.__name__, (base,), attrs)


_LIVE = {
    "list": _live_class(
        list,
        ("append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse")
        + ("__setitem__", "__delitem__", "__iadd__", "__imul__"),
    ),
    "dict": _live_class(
        dict,
        ("__setitem__", "__delitem__", "pop", "popitem", "clear", "update", "setdefault")
        + ("__ior__",),
    ),
    "set": _live_class(
        set,
        ("add", "discard", "remove", "pop", "clear", "update", "difference_update")
        + ("intersection_update", "symmetric_difference_update")
        + ("__ior__", "__iand__", "__isub__", "__ixor__"),
    ),
}
_LIVE_TYPES = tuple(_LIVE.values())


class _Remote:
    """T's handle to an object that lives in C (never compared; ``bool()`` asked of C)."""

    __slots__ = ("_client", "_key")

    def __init__(self, client, key):
        object.__setattr__(self, "_client", client)
        object.__setattr__(self, "_key", key)

    def _ask(self, op, *args):
        return object.__getattribute__(self, "_client").request(
            op, object.__getattribute__(self, "_key"), *args
        )

    def _wire(self, x):
        return object.__getattribute__(self, "_client").to_wire(x)

    def __call__(self, *args, **kwargs):
        client = object.__getattribute__(self, "_client")
        client.sent = (args, kwargs)
        op = "callwb" if client.unittest_mode else "call"
        label = client.labels.get(object.__getattribute__(self, "_key"), "<program object>")
        try:
            value = self._ask(op, self._wire(args), self._wire(kwargs))
        except BaseException as exc:
            client.last_call = (label, args, kwargs, False, exc)
            raise
        client.last_call = (label, args, kwargs, True, value)
        return value

    def __getattr__(self, name):
        if name.startswith("__") and name not in _FORWARDED_DUNDERS:
            raise AttributeError(name)
        client = object.__getattribute__(self, "_client")
        op = "getlive" if client.unittest_mode else "getattr"
        value = self._ask(op, name)
        if type(value) is _Remote:
            key = object.__getattribute__(value, "_key")
            if key not in client.labels:
                client.labels[key] = name  # a method: shown as obj.name(...) in feedback
        return value

    def __setattr__(self, name, value):
        self._ask("setattr", name, self._wire(value))

    def __iter__(self):
        return iter(self._ask("iter"))

    def __len__(self):
        return self._ask("len")

    def __setitem__(self, key, value):
        self._ask("setitem", self._wire(key), self._wire(value))

    def __delitem__(self, key):
        self._ask("delitem", self._wire(key))

    def __bool__(self):
        # Python's rule, decided here: an object is true unless its class defines
        # ``__bool__`` (whose answer would be the program's: refused) or ``__len__``
        # (then its length, a plain int, decides).
        rule = self._ask("truth")
        if rule == "none":
            return True
        if rule == "len":
            length = self._ask("len")
            if type(length) is not int:
                raise _Tampered("a length answered with a non-int")
            return length != 0
        if rule == "bool":
            raise TypeError(
                "the truth of a program's object whose class defines __bool__ is not decided "
                "by the program: compare a plain value it returns"
            )
        raise _Tampered("a truth rule answered with an unknown value")

    def __getitem__(self, key):
        return self._ask("getitem", self._wire(key))

    def __contains__(self, item):
        # Decided here, on plain data: the items the object's iteration yields (as Python
        # does for a class without ``__contains__``); its own ``__contains__`` never runs.
        items = self._ask("iter")
        if type(items) not in (list, *_LIVE_TYPES):
            raise _Tampered("an iteration answered with a non-list")
        return item in items

    def __instancecheck__(self, instance):
        return self._plain_bool("isinstance", instance)

    def __subclasscheck__(self, cls):
        return self._plain_bool("issubclass", cls)

    def _plain_bool(self, op, value):
        try:
            wired = self._wire(value)
        except (TypeError, ValueError):
            return False  # a value of T's own (a class of the tests) is never C's
        answer = self._ask(op, wired)
        if type(answer) is not bool:
            raise _Tampered(f"{op} answered with a non-bool")
        return answer

    def __str__(self):
        return self._ask("str")

    def __repr__(self):
        return self._ask("repr")

    def _refuse(self, *args):
        raise TypeError(
            "a value of a non-builtin type from the candidate cannot be compared, "
            "truth-tested or used in arithmetic by the tests"
        )

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _refuse
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _refuse
    __truediv__ = __rtruediv__ = __floordiv__ = __mod__ = __abs__ = __neg__ = _refuse
    __float__ = __int__ = __index__ = __round__ = __and__ = __or__ = __xor__ = _refuse
    __hash__ = object.__hash__


def run_check(runner, cfg, fd, info):
    """T: compile, fork C, read the secrets, run the plan, write the verdict; exits."""
    global _R
    _R = runner
    base = {"kind": "verdict", "passed": 0, "program_loaded": False, "calls": {}, "errors": []}
    try:
        code = _R._compile(cfg["code"], "<program>", "exec")
    except (_R._SyntaxError, ValueError, MemoryError, RecursionError, OverflowError) as exc:
        nonce = _R._secrets()["nonce"]
        _R._emit(fd, nonce, info)
        base["syntax_error"] = _R._short(exc)
        _R._emit(fd, nonce, base)
        _R._exit(0)
    tag = os.urandom(16)
    to_c_r, to_c_w = os.pipe()
    to_t_r, to_t_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # C: nothing of the tests or the result channel may stay reachable
        try:
            os.close(fd)
            os.close(to_c_w)
            os.close(to_t_r)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)
            _R._libc().prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
            if cfg.get("single_process_bpf"):  # no cgroup: the program gets this process only
                _R._install_filter(cfg["single_process_bpf"])
        except BaseException:
            _R._exit(1)
        _serve(cfg, code, to_c_r, to_t_w, tag)
        _R._exit(0)
    os.close(to_c_r)
    os.close(to_t_w)
    secrets = _R._secrets()
    nonce = secrets["nonce"]
    _R._emit(fd, nonce, info)
    client = _Client(pid, to_c_w, to_t_r, tag, _R._PRISTINE_BUILTINS)
    try:
        _run_plan(client, secrets, base, cfg.get("track_calls"), _R._list(cfg.get("names", ())))
    except _Tampered as exc:
        client.stop("tampered")
        base = {"kind": "verdict", "passed": 0, "tampered": _R._str(exc), "errors": []}
    except _CandidateGone:
        # C ended before the tests could use it (exit while loading, crash): no verdict.
        client.stop("gone")
        _R._mirror(client.exited if client.exited is not None else 9)
    client.stop("done")
    _R._wait_for(pid)
    _R._emit(fd, nonce, base)
    try:
        sys.__stdout__.flush()
    except BaseException:
        pass
    _R._exit(0)


def _timed(client, budget, fn, *args):
    """``fn(*args)`` under T's own timer of ``budget`` seconds (none when falsy); raises
    ``_R._UnitTimeout`` past it and then stops C (it did not answer in time)."""
    try:
        _R._signal(_R.signal.SIGALRM, _R._on_alarm)
        if budget:
            _R._setitimer(_R.signal.ITIMER_REAL, budget)
        return fn(*args)
    except _R._UnitTimeout:
        client.stop(f"did not answer within {budget}s")
        raise
    finally:
        try:
            _R._setitimer(_R.signal.ITIMER_REAL, 0)
        except BaseException:
            pass


def _run_plan(client, secrets, base, track, names):
    unit_timeout = secrets.get("assert_timeout_s")
    load_timeout = secrets.get("load_timeout_s") or unit_timeout
    try:
        msg = _timed(client, load_timeout, client.reply)
    except _R._UnitTimeout:
        base["load_timeout"] = True
        base["program_error"] = f"the program did not finish loading within {load_timeout}s"
        return
    if msg[0] == "load_error" and len(msg) == 2:
        base["program_error"] = _R._str(msg[1])
        return
    if msg[0] != "loaded" or len(msg) != 3 or type(msg[1]) is not int:
        raise _Tampered("bad load report")
    base["program_loaded"] = True
    bdict = _R._dict(_R._PRISTINE_BUILTINS)
    tns = {"__builtins__": bdict, "__name__": "__check__"}
    arg_name = secrets["arg_name"]
    wanted = [n for n in names if type(n) is str and n not in bdict and n[:2] != "__"]
    _bind_names(tns, client.from_wire(msg[2]), wanted)
    for name in wanted:
        if type(tns.get(name)) is _Remote:
            client.labels.setdefault(object.__getattribute__(tns[name], "_key"), name)
    tns[arg_name] = client.remote(msg[1])
    client.labels[msg[1]] = _R._str(secrets.get("entry_label") or arg_name)
    tns["__comlrl_unittest__"] = _unittest_runner(client)
    passed, results, errors = 0, [], []
    failed_calls = []  # (unit number, the unit's last call into the program) of failed units
    for source, is_unit in secrets["plan"]:
        try:
            unit = _R._compile(source, "<test>", "exec")
        except BaseException as exc:
            if is_unit:
                results.append(False)
            errors.append("test statement does not compile: " + _R._short(exc))
            continue
        ok, err = True, ""
        client.last_call = client.failure_call = None
        try:
            _R._signal(_R.signal.SIGALRM, _R._on_alarm)
            if unit_timeout:
                client.deadline = _monotonic() + unit_timeout
                _R._setitimer(_R.signal.ITIMER_REAL, unit_timeout + _GRACE_S)
            _R._exec(unit, tns)
        except _R._UnitTimeout:
            ok, err = False, f"timed out after {unit_timeout}s"
            if client.waiting:  # C did not answer within the budget and the grace
                client.stop(f"stopped after a test unit timed out ({unit_timeout}s)")
        except _Tampered:
            raise
        except _CandidateGone as exc:
            if client.exited is not None:
                raise  # C exited or crashed in a call: no verdict, as if in one process
            ok, err = False, f"{type(exc).__name__}: {exc}"
        except BaseException as exc:
            ok, err = False, _R._short(exc)
        finally:
            try:
                _R._setitimer(_R.signal.ITIMER_REAL, 0)
            except BaseException:
                pass
            client.deadline = None
            client.waiting = False
        if is_unit:
            results.append(ok)
            passed += 1 if ok else 0
            call = client.failure_call or client.last_call
            if not ok and call is not None and len(failed_calls) < _OBSERVED:
                failed_calls.append((len(results), call))
        if not ok and len(errors) < 5:
            errors.append((f"assert #{len(results)}: " if is_unit else "setup: ") + err)
    base["passed"] = passed
    base["units"] = results
    base["errors"] = errors

    if client.dead is None and track:
        try:
            calls = _timed(client, unit_timeout or 1.0, client.request, "stats")
            base["calls"] = {k: v for k, v in calls.items() if type(k) is str and type(v) is int}
        except (_CandidateGone, _R._UnitTimeout):
            pass
    base["observed"] = [[n, _describe_call(client, call, unit_timeout)] for n, call in failed_calls]


_OBSERVED = 2  # failed units whose last call into the program the verdict describes
_SHOWN = 160  # characters of one repr in such a description


def _describe_call(client, call, budget):
    """``"name(args) returned value"`` / ``"... raised Type: message"``: the last call a
    failed unit made into the program, for feedback that shows the program's own output
    (never the tests' expected values). Reprs of the program's objects are asked of C
    under ``budget``; one that does not come reads ``<no answer>``."""
    label, args, kwargs, ok, value = call

    def shown(x):
        try:
            text = _timed(client, budget or 1.0, repr, x)
        except (_CandidateGone, _Tampered, _R._UnitTimeout):
            return "<no answer>"
        except BaseException:
            return "<unprintable>"
        text = _R._str(text) if type(text) is str else "<unprintable>"
        return text if len(text) <= _SHOWN else text[: _SHOWN - 4] + " ..."

    parts = [shown(a) for a in args] + [f"{k}={shown(v)}" for k, v in kwargs.items()]
    head = f"{label}({', '.join(parts)})"
    if ok:
        return f"{head} returned {shown(value)}"
    if isinstance(value, _R._UnitTimeout):
        return f"{head} did not return within the time budget"
    return f"{head} raised {_R._short(value, _SHOWN)}"


def _unittest_runner(client):
    """``run(candidate, case, method)``: one ``unittest`` test method run in T; raises
    ``AssertionError`` unless the test itself reported success, else returns ``True``.

    The test classes, ``unittest`` and the result object all live in T; the program's
    objects are handles. A skip, an expected failure, an error or failure (subtests
    included), a test that did not run, or one that never reported its success fails the
    unit; a unit that ran past its budget raises ``_UnitTimeout`` (C was stopped).
    """
    state = {}

    def run(candidate, case, method):
        if "unittest" not in state:
            import unittest

            class Result(unittest.TestResult):
                def __init__(self):
                    super().__init__()
                    self.successes = []

                def addSuccess(self, test):
                    self.successes.append(test)

                def addFailure(self, test, err):
                    client.failure_call = client.failure_call or client.last_call
                    super().addFailure(test, err)

                def addError(self, test, err):
                    client.failure_call = client.failure_call or client.last_call
                    super().addError(test, err)

            state["unittest"], state["result"] = unittest, Result
        unittest = state["unittest"]
        if not (type(case) is type and issubclass(case, unittest.TestCase)):
            raise AssertionError(f"{case!r} is not a unittest.TestCase class of the tests")
        test = case(method)
        body = getattr(test, method, None)
        if callable(body):
            import functools

            # the unit's last call is taken when the test method raises, before tearDown
            # runs: Python 3.10 reports a failure to the result only after tearDown
            # (3.11+ at once), and tearDown's calls are not what the unit checked
            def checked(*args, _body=body, **kwargs):
                try:
                    return _body(*args, **kwargs)
                except BaseException:
                    client.failure_call = client.failure_call or client.last_call
                    raise

            setattr(test, method, functools.wraps(body)(checked))
        result = state["result"]()
        client.unittest_mode = True
        try:
            unittest.TestSuite([test]).run(result)
        finally:
            client.unittest_mode = False
        if client.timed_out:
            client.timed_out = False
            raise _R._UnitTimeout()
        for _, trace in result.errors + result.failures:
            lines = [ln for ln in trace.strip().splitlines() if ln.strip()]
            raise AssertionError(lines[-1][:300] if lines else "test failed")
        if result.skipped or result.expectedFailures or result.unexpectedSuccesses:
            raise AssertionError(f"test {method} was skipped or marked as an expected failure")
        if result.testsRun != 1 or len(result.successes) != 1 or result.successes[0] is not test:
            raise AssertionError(f"test {method} did not report its success")
        return True

    return run


def _bind_names(tns, found, wanted):
    """Bind the names of ``wanted`` that C's load report says the program defines.

    ``wanted`` is decided here, in T: the test's free names (the parent's parse) less
    T's own builtins. Whatever else C reports (a builtin's name, a name of its choosing)
    is ignored, so the tests' ``abs``, ``range``, ``tuple`` stay T's.
    """
    if type(found) is not dict:
        raise _Tampered("bad resolve reply")
    for name in wanted:
        if name not in found:
            continue
        entry = found[name]
        if type(entry) is not tuple or len(entry) != 2:
            raise _Tampered("bad resolve entry")
        kind, value = entry
        if kind == "m" and type(value) is str:
            try:
                __import__(value)
                tns[name] = sys.modules[value]
            except BaseException:
                pass
        elif kind == "v":
            tns[name] = value
        else:
            raise _Tampered("bad resolve entry")
