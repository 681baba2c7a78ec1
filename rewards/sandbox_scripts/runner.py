"""Runs inside a sandbox with ``python3 -I runner.py judge`` (or ``... runner.py`` for user
reward functions); the request arrives on stdin.

``judge``: two processes, so that the verdict never shares an interpreter with the candidate.

1. The judge makes itself non-dumpable (``prctl``: no other process of the sandbox can open
   its ``/proc/<pid>/mem`` or descriptors) and forks the *candidate server* before reading
   anything secret. The server closes every descriptor but its two pipes (stdin becomes
   /dev/null, stdout goes to stderr) and waits.
2. The judge reads the whole request from stdin (tests, expected values, the record key),
   to EOF, so nothing secret is left in any pipe, then tells the server to load the
   candidate's code (``solution.py``). The server's memory is a copy of the judge from
   before the request was read: the tests were never in it.
3. The judge runs the tests in its own namespace. Each name the tests take from the
   candidate is a proxy: calling it sends the arguments as plain values to the server,
   which calls the candidate's function and sends back a plain value (strictly typed JSON,
   decoded by the judge; objects of other types stay in the server behind a handle whose
   comparisons are never delegated). Expected values never leave the judge.
4. At the end the judge kills every other process of the sandbox (``kill(-1)``) and checks
   that none is left; only then does it write its records, each signed with the request's
   key (BLAKE2b), to the descriptor that was stdout. No candidate process holds that pipe,
   and none is alive when the records are written.

``workload`` (runtime_efficiency) is the same split, but the server evaluates the public
workload expression itself and the judge only relays the value; afterwards the judge empties
/work and /tmp so a later measured run cannot reuse what this one left.

Without ``judge`` (user reward functions): one process, the old literal request and records.
"""

import builtins
import math
import os
import sys

MARKER = "@@rewards-record "
MAX_DEPTH = 100
MAX_ITEMS = 200000
MAX_MESSAGE = 64 * 1024 * 1024
MAX_GLOBALS = 5000
PR_SET_DUMPABLE = 4


# --- plain values as JSON -------------------------------------------------------------------
# The C scanner and encoder of `_json` directly: importing `json` (and `re` with it) costs
# more than a typical test run.


class NotPlain(TypeError):
    pass


class BadValue(ValueError):
    pass


def _json_codec():
    import _json

    class Context:
        strict = True
        object_hook = None
        object_pairs_hook = None
        parse_float = float
        parse_int = int
        memo = {}

        @staticmethod
        def parse_constant(name):
            raise BadValue(f"{name} is not a value")

    scanner = _json.make_scanner(Context())  # type: ignore[arg-type]
    # markers, default, encoder, indent, separators, sort_keys, skipkeys, allow_nan
    arguments = (None, None, _json.encode_basestring_ascii, None, ":", ",", False, False, False)
    encoder = _json.make_encoder(*arguments)  # type: ignore[arg-type]

    def dumps(value):
        return "".join(encoder(value, 0)).encode("ascii")

    def loads(data):
        text = data.decode("ascii")
        value, end = scanner(text, 0)
        if end != len(text):
            raise BadValue("trailing data")
        return value

    return dumps, loads


dumps, loads = _json_codec()
_SCALARS = (str, bool, type(None))


def to_wire(value, handle=None, depth=0, budget=None):
    """A plain value as JSON data: scalars as themselves, containers tagged. Values of any
    other type become handles when ``handle`` is given (the server), else `NotPlain`."""
    if budget is None:
        budget = [MAX_ITEMS]
    budget[0] -= 1
    if budget[0] < 0:
        raise NotPlain("value too large to send")
    if depth > MAX_DEPTH:
        raise NotPlain("value nested too deeply")
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is int:
        return value if -(10**300) < value < 10**300 else {"i": hex(value)}
    if kind is float:
        return value if math.isfinite(value) else {"f": repr(value)}
    if kind is list:
        return [to_wire(v, handle, depth + 1, budget) for v in value]
    if kind is tuple:
        return {"t": [to_wire(v, handle, depth + 1, budget) for v in value]}
    if kind is dict:
        return {
            "d": [
                [to_wire(k, handle, depth + 1, budget), to_wire(v, handle, depth + 1, budget)]
                for k, v in value.items()
            ]
        }
    if kind is set:
        return {"s": [to_wire(v, handle, depth + 1, budget) for v in value]}
    if kind is frozenset:
        return {"fs": [to_wire(v, handle, depth + 1, budget) for v in value]}
    if kind is bytes:
        return {"b": value.hex()}
    if kind is complex:
        return {"c": [to_wire(value.real), to_wire(value.imag)]}
    if handle is not None:
        return {"r": handle(value)}
    raise NotPlain(f"a {kind.__module__}.{kind.__qualname__} cannot be sent to the candidate")


def from_wire(data, resolve, depth=0):
    """The inverse of `to_wire`; ``resolve`` turns a handle number into an object. Anything
    malformed raises `BadValue`: in the judge, these bytes come from the candidate."""
    if depth > MAX_DEPTH:
        raise BadValue("value nested too deeply")
    kind = type(data)
    if kind in _SCALARS or kind is int or kind is float:
        return data
    if kind is list:
        return [from_wire(v, resolve, depth + 1) for v in data]
    if kind is not dict or len(data) != 1:
        raise BadValue("malformed value")
    ((tag, inner),) = data.items()
    if tag == "t" and type(inner) is list:
        return tuple(from_wire(v, resolve, depth + 1) for v in inner)
    if tag == "d" and type(inner) is list:
        pairs = {}
        for pair in inner:
            if type(pair) is not list or len(pair) != 2:
                raise BadValue("malformed dict")
            pairs[from_wire(pair[0], resolve, depth + 1)] = from_wire(pair[1], resolve, depth + 1)
        return pairs
    if tag == "s" and type(inner) is list:
        return {from_wire(v, resolve, depth + 1) for v in inner}
    if tag == "fs" and type(inner) is list:
        return frozenset(from_wire(v, resolve, depth + 1) for v in inner)
    if tag == "i" and type(inner) is str and len(inner) < 10000:
        return int(inner, 16)
    if tag == "f" and inner in ("nan", "inf", "-inf"):
        return float(inner)
    if tag == "b" and type(inner) is str:
        return bytes.fromhex(inner)
    if tag == "c" and type(inner) is list and len(inner) == 2:
        return complex(float(inner[0]), float(inner[1]))
    if tag == "r" and type(inner) is int:
        return resolve(inner)
    raise BadValue("malformed value")


def describe(exc):
    return f"{type(exc).__name__}: {exc}"[:500]


# --- pipes between judge and server ---------------------------------------------------------


class Gone(Exception):
    """The other side of the pipe exited."""


def send(fd, message):
    data = dumps(message)
    view = memoryview(len(data).to_bytes(8, "big") + data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def receive(fd):
    header = _read_exactly(fd, 8)
    size = int.from_bytes(header, "big")
    if size > MAX_MESSAGE:
        raise BadValue("message too large")
    return loads(_read_exactly(fd, size))


def _read_exactly(fd, size):
    chunks = []
    while size:
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            raise Gone("the candidate's process exited")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


# --- the candidate server -------------------------------------------------------------------


def serve(requests, replies, config):
    """Loads the candidate and answers the judge's requests until told to stop."""
    handles: dict = {}

    def handle(value):
        handles[len(handles) + 1] = value
        return len(handles)

    def resolve(number):
        if number not in handles:
            raise BadValue("unknown handle")
        return handles[number]

    coverage = None
    solution = os.path.abspath(config["solution"])
    if config.get("coverage"):
        sys.path.insert(0, "/image/site")
        import coverage as coverage_module

        coverage = coverage_module.Coverage(
            data_file=None,
            include=[solution],
            branch=bool(config.get("branch")),
            config_file=False,
        )
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        with open(solution, encoding="utf-8") as file:
            source = file.read()
        if coverage is not None:
            coverage.start()
        exec(compile(source, solution, "exec"), namespace)  # noqa: S102 - in the sandbox
        if config.get("setup"):
            exec(compile(config["setup"], "<setup>", "exec"), namespace)  # noqa: S102
    except BaseException as exc:
        send(replies, {"load_error": describe(exc)})
        return
    if config.get("workload") is not None:
        try:
            value = eval(compile(config["workload"], "<workload>", "eval"), namespace)  # noqa: S307
            send(replies, {"value": to_wire(value)})
        except BaseException as exc:
            send(replies, {"error": describe(exc)})
        return
    exported = {}
    for name, value in list(namespace.items())[:MAX_GLOBALS]:
        if name.startswith("__"):
            continue
        if type(value).__name__ == "module":
            exported[name] = {"module": str(getattr(value, "__name__", ""))}
        elif callable(value):
            described: dict = {"callable": handle(value)}
            module = getattr(value, "__module__", None)
            qualname = getattr(value, "__qualname__", None)
            if type(module) is str and type(qualname) is str and module != "solution":
                # Imported, not written here (``from math import isclose``): the judge
                # takes its own copy, so a test's helper never runs in this process.
                described["from"] = [module, qualname]
            exported[name] = described
        else:
            try:
                exported[name] = {"value": to_wire(value, handle)}
            except NotPlain:
                continue
    send(replies, {"ready": exported})
    while True:
        request = receive(requests)
        op = request.get("op")
        if op == "exit":
            return
        if op == "coverage":
            if coverage is None:
                send(replies, {"raise": ["RuntimeError", "no coverage"]})
                continue
            coverage.stop()
            _, statements, _, missing, _ = coverage.analysis2(solution)
            send(replies, {"ok": {"statements": sorted(statements), "missing": sorted(missing)}})
            continue
        try:
            target = resolve(request["ref"])
            if op == "call":
                args = [from_wire(a, resolve) for a in request["args"]]
                kwargs = {k: from_wire(v, resolve) for k, v in request["kwargs"]}
                sent = request["args"]
                result = target(*args, **kwargs)
                reply = {"ok": to_wire(result, handle)}
                changed = []
                for index, arg in enumerate(args):
                    if type(arg) in (list, dict, set):
                        now = to_wire(arg, handle)
                        if now != sent[index]:
                            changed.append([index, now])
                if changed:
                    reply["changed"] = changed
            elif op == "getattr":
                reply = {"ok": to_wire(getattr(target, request["name"]), handle)}
            elif op == "setattr":
                setattr(target, request["name"], from_wire(request["value"], resolve))
                reply = {"ok": None}
            elif op == "getitem":
                reply = {"ok": to_wire(target[from_wire(request["key"], resolve)], handle)}
            elif op == "setitem":
                target[from_wire(request["key"], resolve)] = from_wire(request["value"], resolve)
                reply = {"ok": None}
            elif op == "len":
                reply = {"ok": to_wire(len(target))}
            elif op == "bool":
                reply = {"ok": bool(target)}
            elif op == "str":
                reply = {"ok": str(target)}
            elif op == "repr":
                reply = {"ok": repr(target)}
            elif op == "list":
                reply = {"ok": to_wire(list(target), handle)}
            elif op == "next":
                reply = {"ok": to_wire(next(target), handle)}
            else:
                reply = {"raise": ["RuntimeError", f"unknown request {op!r}"]}
        except BaseException as exc:
            reply = {"raise": [type(exc).__name__, str(exc)[:500]]}
        try:
            send(replies, reply)
        except NotPlain as exc:
            send(replies, {"raise": ["TypeError", str(exc)]})


# --- the judge ------------------------------------------------------------------------------


def _no_handles(number):
    raise BadValue("a handle where a plain value was due")


class Deadline(BaseException):
    """The judge's time is up (a BaseException, so a test's bare ``except`` cannot hide it
    for long: the alarm keeps firing until the test gives up)."""


class CandidateError(Exception):
    """An exception the candidate raised that the judge does not re-create by type."""


class Judge:
    """The judge's side of the pipes: one request, one reply, in order."""

    def __init__(self, requests, replies):
        self.requests = requests
        self.replies = replies
        self.expired = False  # the deadline passed: no more requests
        self.gone = None  # why the candidate can no longer answer

    def ask(self, message):
        if self.expired:
            raise Deadline("timed out")
        if self.gone is not None:
            raise CandidateError(self.gone)
        try:
            send(self.requests, message)
            reply = receive(self.replies)
        except (Gone, OSError) as exc:
            self.gone = "the candidate's process exited"
            raise CandidateError(self.gone) from exc
        except (BadValue, ValueError, RecursionError, MemoryError) as exc:
            self.gone = f"the candidate sent a malformed reply: {exc}"
            raise CandidateError(self.gone) from exc
        if type(reply) is not dict:
            self.gone = "the candidate sent a malformed reply"
            raise CandidateError(self.gone)
        if "raise" in reply:
            name, message = (list(reply["raise"]) + ["", ""])[:2]
            raise rebuilt_exception(str(name), str(message))
        return reply

    def ask_first(self):
        """The server's first message: its names, its workload value or why it failed."""
        try:
            reply = receive(self.replies)
        except (Gone, OSError):
            return {"load_error": "the candidate's process exited while loading"}
        except (BadValue, ValueError, RecursionError, MemoryError) as exc:
            return {"load_error": f"the candidate sent a malformed reply: {exc}"}
        if type(reply) is not dict:
            return {"load_error": "the candidate sent a malformed reply"}
        if "value" in reply:
            try:
                from_wire(reply["value"], _no_handles)
            except (BadValue, ValueError, TypeError, RecursionError) as exc:
                return {"error": f"the candidate returned a malformed value: {exc}"}
        return reply

    def value(self, data):
        try:
            return from_wire(data, self.remote)
        except (BadValue, ValueError, TypeError, RecursionError) as exc:
            raise CandidateError(f"the candidate returned a malformed value: {exc}") from exc

    def remote(self, number):
        return Remote(self, number)


_REBUILT = {
    name: cls
    for name, cls in vars(builtins).items()
    if isinstance(cls, type) and issubclass(cls, Exception)
}


def rebuilt_exception(name, message):
    cls = _REBUILT.get(name)
    if cls is None:
        return CandidateError(f"{name}: {message}")
    try:
        return cls(message)
    except Exception:
        return CandidateError(f"{name}: {message}")


class Remote:
    """An object that lives in the candidate's process. Calls, attributes, items, length,
    truth and text are asked of the candidate (it could return those as plain values
    anyway); comparisons are not: they would hand it the expected value, so a candidate
    object equals only itself."""

    __slots__ = ("_judge", "_ref")

    def __init__(self, judge, ref):
        object.__setattr__(self, "_judge", judge)
        object.__setattr__(self, "_ref", ref)

    def _ask(self, op, **fields):
        reply = self._judge.ask({"op": op, "ref": self._ref, **fields})
        return reply

    def __call__(self, *args, **kwargs):
        sent = [to_wire(a, self._local_handle) for a in args]
        pairs = [[str(k), to_wire(v, self._local_handle)] for k, v in kwargs.items()]
        reply = self._ask("call", args=sent, kwargs=pairs)
        for index, now in reply.get("changed") or []:
            if type(index) is int and 0 <= index < len(args):
                _update_in_place(args[index], self._judge.value(now))
        return self._judge.value(reply.get("ok"))

    @staticmethod
    def _local_handle(value):
        if type(value) is Remote:
            return object.__getattribute__(value, "_ref")
        raise NotPlain(f"a {type(value).__name__} cannot be sent to the candidate")

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._judge.value(self._ask("getattr", name=name).get("ok"))

    def __setattr__(self, name, value):
        self._ask("setattr", name=name, value=to_wire(value, self._local_handle))

    def __getitem__(self, key):
        return self._judge.value(
            self._ask("getitem", key=to_wire(key, self._local_handle)).get("ok")
        )

    def __setitem__(self, key, value):
        self._ask(
            "setitem",
            key=to_wire(key, self._local_handle),
            value=to_wire(value, self._local_handle),
        )

    def __len__(self):
        length = self._judge.value(self._ask("len").get("ok"))
        if type(length) is not int or length < 0:
            raise TypeError("len() of a candidate object is not a count")
        return length

    def __bool__(self):
        truth = self._ask("bool").get("ok")
        if type(truth) is not bool:
            raise TypeError("the candidate's truth value is not a bool")
        return truth

    def __iter__(self):
        items = self._judge.value(self._ask("list").get("ok"))
        if type(items) is not list:
            raise TypeError("the candidate's iteration is not a list")
        return iter(items)

    def __next__(self):
        return self._judge.value(self._ask("next").get("ok"))

    def __contains__(self, item):
        # Iterated here, not asked: asking would show the candidate the value looked for.
        return any(item == candidate for candidate in self)

    def __str__(self):
        text = self._ask("str").get("ok")
        return text if type(text) is str else ""

    def __repr__(self):
        text = self._ask("repr").get("ok")
        return text if type(text) is str else "<candidate object>"

    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other

    __lt__ = __le__ = __gt__ = __ge__ = lambda self, other: NotImplemented

    def __hash__(self):
        return id(self)


def _update_in_place(original, now):
    """Mirrors the candidate's in-place change of an argument (``sort_in_place(xs)``)."""
    kind = type(original)
    if kind is list and type(now) is list:
        original[:] = now
    elif kind in (dict, set) and type(now) is kind:
        original.clear()
        original.update(now)


class _Discard:
    def write(self, text):
        return len(text)

    def flush(self):
        pass


def _pytest_shim():
    """A stand-in for ``pytest.raises`` and ``pytest.approx`` when pytest is not installed in
    the sandbox (the tests of pytest-style suites use little else)."""
    import types

    module = types.ModuleType("pytest")

    class Raises:
        def __init__(self, expected, match=None):
            self.expected, self.match, self.value = expected, match, None

        def __enter__(self):
            return self

        def __exit__(self, kind, value, traceback):
            if kind is None:
                raise AssertionError(f"DID NOT RAISE {self.expected}")
            if not issubclass(kind, self.expected):
                return False
            if self.match is not None and str(self.match) not in str(value):
                raise AssertionError(f"{value!r} does not match {self.match!r}")
            self.value = value
            return True

    def raises(expected, *args, match=None, **kwargs):
        if args:
            with Raises(expected, match):
                args[0](*args[1:], **kwargs)
            return None
        return Raises(expected, match)

    class Approx:
        def __init__(self, expected, rel=None, abs=None):
            self.expected = expected
            self.rel = 1e-6 if rel is None else rel
            self.abs = 1e-12 if abs is None else abs

        def _close(self, got, want):
            if isinstance(want, (list, tuple)):
                return (
                    isinstance(got, (list, tuple))
                    and len(got) == len(want)
                    and all(self._close(g, w) for g, w in zip(got, want, strict=True))
                )
            if type(got) not in (int, float, complex) or type(got) is bool:
                return False
            return abs(got - want) <= max(self.rel * abs(want), self.abs)

        def __eq__(self, other):
            return self._close(other, self.expected)

        def __repr__(self):
            return f"approx({self.expected!r})"

    setattr(module, "raises", raises)  # noqa: B010 - a module built here
    setattr(module, "approx", Approx)  # noqa: B010
    return module


def _run_item(item, namespace, judge):
    """Runs one test in the judge's namespace; returns its record (without the id)."""
    split = item.get("split")
    if split is not None:
        for statement in split["before"]:
            exec(compile(statement, f"<test {item['id']}>", "exec"), namespace)  # noqa: S102
        left = eval(compile(split["left"], f"<test {item['id']}>", "eval"), namespace)  # noqa: S307
        right = eval(compile(split["right"], f"<test {item['id']}>", "eval"), namespace)  # noqa: S307
        if _compare(split["op"], left, right):
            return {"passed": True}
        shown = right if split.get("candidate_side") == "right" else left
        try:
            got = repr(shown)[:300]
        except Exception as exc:
            got = describe(exc)
        return {"passed": False, "got": got, "error": "AssertionError"}
    if item.get("source"):
        exec(compile(item["source"], f"<test {item['id']}>", "exec"), namespace)  # noqa: S102
    call = item.get("call")
    if call is not None:
        if call.get("unittest"):
            import unittest

            cases = unittest.defaultTestLoader.loadTestsFromTestCase(namespace[call["unittest"]])
            result = unittest.TestResult()
            cases.run(result)
            problems = result.failures + result.errors
            if problems or not result.testsRun:
                return {
                    "passed": False,
                    "error": (problems[0][1] if problems else "no tests")[-500:],
                }
            return {"passed": True}
        function = namespace[call["name"]]
        args = [namespace[name] for name in call.get("args", [])]
        function(*args)
    return {"passed": True}


def _compare(op, left, right):
    if op == "Eq":
        return left == right
    if op == "NotEq":
        return left != right
    if op == "Lt":
        return left < right
    if op == "LtE":
        return left <= right
    if op == "Gt":
        return left > right
    if op == "GtE":
        return left >= right
    if op == "In":
        return left in right
    if op == "NotIn":
        return left not in right
    if op == "Is":
        return left is right
    if op == "IsNot":
        return left is not right
    raise ValueError(f"unknown comparison {op}")


def _protect_self():
    """No other process of the sandbox (same uid) may read or write this one's memory or
    descriptors through /proc once it is non-dumpable."""
    try:
        result, errno = _prctl_without_ctypes(PR_SET_DUMPABLE, 0)
    except Exception:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        result = libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        errno = ctypes.get_errno()
    if result != 0:
        raise OSError(errno, "prctl(PR_SET_DUMPABLE) failed")


def _prctl_without_ctypes(option, value):
    """``prctl`` through `_ctypes` alone: importing the `ctypes` package costs a millisecond
    and a half, more than the rest of a typical judge run."""
    import _ctypes

    class Int(_ctypes._SimpleCData):
        _type_ = "i"

    class Function(_ctypes.CFuncPtr):
        _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
        _restype_ = Int

    libc = _ctypes.dlopen(None, os.RTLD_NOW)  # type: ignore[arg-type]
    prctl = Function(_ctypes.dlsym(libc, "prctl"))
    prctl.argtypes = (Int, Int, Int, Int, Int)
    _ctypes.set_errno(0)
    return prctl(option, value, 0, 0, 0), _ctypes.get_errno()


def _others_alive(me):
    alive = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in (1, me):
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as file:
                state = file.read().rsplit(b")", 1)[-1].split()[0]
        except OSError:
            continue
        if state not in (b"Z", b"X"):
            alive.append(int(entry))
    return alive


def _end_every_other_process(server_pid):
    """SIGKILL to every process of the sandbox but pid 1 and this one, until none is left."""
    import _signal
    import time

    me = os.getpid()
    for attempt in range(400):
        try:  # noqa: SIM105 - contextlib would cost an import in every judge
            os.kill(-1, _signal.SIGKILL)
        except OSError:
            pass
        if attempt == 0:
            # The server, at least, is reaped here: waiting is cheaper than polling.
            try:  # noqa: SIM105 - no contextlib import in the judge
                os.waitpid(server_pid, 0)
            except ChildProcessError:
                pass
        if not _others_alive(me):
            return True
        time.sleep(0.002)
    return False


def _wipe_writable():
    """Empties /work and /tmp (runtime rounds must not find what an earlier round cached);
    `chmod` first, since the candidate may have locked its directories."""
    script = (
        "chmod -R u+rwX /work /tmp 2>/dev/null; "
        "rm -rf /work/* /work/.[!.]* /work/..?* /tmp/* /tmp/.[!.]* /tmp/..?* 2>/dev/null; true"
    )
    pid = os.posix_spawn("/bin/sh", ["sh", "-c", script], {"PATH": "/usr/bin:/bin"})
    os.waitpid(pid, 0)


def judge_main():
    import _signal

    started = _monotonic()
    try:
        _protect_self()
    except Exception as exc:
        sys.stderr.write(f"judge cannot protect itself: {describe(exc)}\n")
        return 3
    from _blake2 import blake2b

    requests_read, requests_write = os.pipe()
    replies_read, replies_write = os.pipe()
    server_pid = os.fork()
    if server_pid == 0:
        _become_server(requests_read, replies_write, requests_write, replies_read)
        return 0  # not reached
    os.close(requests_read)
    os.close(replies_write)
    request = loads(_read_all(0))
    key = bytes.fromhex(request["key"])
    records_fd = os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    sys.stdout = sys.stderr = _Discard()
    deadline = started + float(request["deadline_s"])
    judge = Judge(requests_write, replies_read)
    records: list = []

    def alarm(signum, frame):
        judge.expired = True
        _signal.setitimer(_signal.ITIMER_REAL, 0.05)
        raise Deadline("timed out")

    _signal.signal(_signal.SIGALRM, alarm)
    _signal.setitimer(_signal.ITIMER_REAL, max(0.01, deadline - _monotonic()))
    try:
        try:
            _judge(request, judge, records)
        except Deadline:
            judge.expired = True
        finally:
            _signal.setitimer(_signal.ITIMER_REAL, 0)
    except Deadline:
        judge.expired = True
    complete = _end_every_other_process(server_pid)
    if request.get("wipe"):
        _wipe_writable()
    if judge.expired:
        records.append({"deadline": True})
    records.append({"done": True, "clean": complete})
    out = []
    for record in records:
        try:
            payload = dumps(record)
        except (TypeError, ValueError, RecursionError):
            payload = dumps({"id": record.get("id"), "error": "unreportable result"})
        mac = blake2b(payload, key=key, digest_size=16).hexdigest()
        out.append(f"\n{MARKER}{mac} {payload.decode('ascii')}\n")
    data = "".join(out).encode("ascii")
    while data:
        data = data[os.write(records_fd, data) :]
    # Nothing is buffered: skip the interpreter's teardown, a few milliseconds per sample.
    os._exit(0)


def _monotonic():
    import time

    return time.monotonic()


def _read_all(fd):
    chunks: list = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _become_server(requests_read, replies_write, requests_write, replies_read):
    try:
        os.close(requests_write)
        os.close(replies_read)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(2, 1)
        os.close(null)
        # Only the open ones (closing every possible number costs milliseconds).
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd > 2 and fd not in (requests_read, replies_write):
                try:  # noqa: SIM105 - no contextlib import in the judge
                    os.close(fd)
                except OSError:
                    pass  # the listing's own descriptor, already closed
        config = receive(requests_read)
        serve(requests_read, replies_write, config)
    except BaseException:  # noqa: S110 - the judge sees the pipe close
        pass
    os._exit(0)


def _judge(request, judge, records):
    send(judge.requests, request["server"])
    ready = judge.ask_first()
    if "load_error" in ready:
        records.append({"load_error": str(ready["load_error"])[:500]})
        return
    if request["server"].get("workload") is not None:
        if "value" in ready:
            records.append({"id": 0, "value": ready["value"]})
        else:
            records.append({"id": 0, "error": str(ready.get("error"))[:500]})
        return
    exported = ready.get("ready")
    if type(exported) is not dict:
        records.append({"load_error": "the candidate's process sent no names"})
        return
    namespace = _test_namespace(exported, request, judge)
    if request.get("setup"):
        try:
            exec(compile(request["setup"], "<setup>", "exec"), namespace)  # noqa: S102
        except Deadline:
            raise
        except BaseException as exc:
            records.append({"load_error": f"the tests' setup failed: {describe(exc)}"})
            return
    for item in request["items"]:
        if judge.expired:
            records.append({"id": item["id"], "error": "not run: time ran out"})
            continue
        try:
            record = _run_item(item, namespace, judge)
        except Deadline:
            record = {"passed": False, "error": "timed out"}
        except BaseException as exc:
            record = {"passed": False, "error": describe(exc)}
            if judge.expired:
                record["error"] = "timed out"
        records.append({"id": item["id"], **record})
    if request["server"].get("coverage") and not judge.expired:
        try:
            report = judge.ask({"op": "coverage", "ref": 0})
            records.append({"coverage": report.get("ok")})
        except (CandidateError, Exception) as exc:
            records.append({"coverage_error": describe(exc)})


def _test_namespace(exported, request, judge):
    """The names the tests may take from the candidate: only those the tests mention and do
    not define themselves, never a builtin's name (a test's ``sorted(x)`` means the
    builtin), modules re-imported here by their real name (a candidate's fake ``math``
    never reaches a test), and the entry point of a ``check(candidate)`` suite."""
    namespace = {"__name__": "tests", "__builtins__": builtins}
    wanted = set(request.get("names", []))
    entry = request.get("entry_point")
    for name, described in exported.items():
        if type(name) is not str or type(described) is not dict:
            continue
        if name != entry and (name not in wanted or hasattr(builtins, name)):
            continue
        try:
            if "module" in described:
                real = str(described["module"])
                if real and not real.startswith("solution"):
                    namespace[name] = __import__(real, fromlist=["_"])
            elif "callable" in described and type(described["callable"]) is int:
                namespace[name] = _own_copy(described.get("from")) or Remote(
                    judge, described["callable"]
                )
            elif "value" in described:
                namespace[name] = judge.value(described["value"])
        except ImportError:
            continue
    if entry is None:
        callables = [d["callable"] for d in exported.values()
                     if type(d) is dict and type(d.get("callable")) is int]  # fmt: skip
        if callables:
            namespace["__entry_point__"] = Remote(judge, callables[-1])
    elif entry in namespace:
        namespace["__entry_point__"] = namespace[entry]
    if "pytest" in wanted:
        try:
            import pytest  # noqa: F401 - present in some images
        except ImportError:
            sys.modules["pytest"] = _pytest_shim()
    return namespace


def _own_copy(origin):
    """The judge's own import of a function or class the candidate imported, or None."""
    if type(origin) is not list or len(origin) != 2:
        return None
    module, qualname = origin
    if type(module) is not str or type(qualname) is not str or "<" in qualname:
        return None
    try:
        found = __import__(module, fromlist=["_"])
        for part in qualname.split("."):
            found = getattr(found, part)
    except Exception:
        return None
    return found if callable(found) else None


# --- user reward functions (one process, as before) -----------------------------------------


def legacy_main():
    request = eval(sys.stdin.read(), {"__builtins__": {}})  # noqa: S307 - the host's literal
    records = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    sys.stdin = open(os.devnull)  # noqa: SIM115 - the code reads EOF, not our request

    def emit(record):
        records.write(MARKER + repr(record) + "\n")
        records.flush()

    if request["mode"] == "function":
        run_function(request, emit)


def run_function(request, emit):
    namespace = {"__name__": "user_reward", "__builtins__": __builtins__}
    try:
        with open(request["source"], encoding="utf-8") as handle:
            exec(compile(handle.read(), "user_reward.py", "exec"), namespace)  # noqa: S102
        function = namespace.get(request["function"])
        if not callable(function):
            emit({"error": f"no function {request['function']!r} in the code"})
            return
        import inspect

        names = list(inspect.signature(function).parameters)
        sample = request["sample"]
        if names[:2] == ["prompts", "completions"]:
            columns = {
                k: [v] for k, v in sample["metadata"].items() if k not in ("prompts", "completions")
            }
            result = function(
                prompts=[sample["prompt"]], completions=[sample["response"]], **columns
            )
            result = result[0] if isinstance(result, list) and result else result
        else:
            result = function(
                sample["domain"], sample["response"], sample["ground_truth"], sample["metadata"]
            )
        if isinstance(result, dict):
            result = result.get("score")
        if type(result) is bool:
            result = float(result)
        if type(result) not in (int, float) or not math.isfinite(result):
            emit({"error": f"returned {type(result).__name__}, not a finite number"})
            return
        emit({"score": float(result)})
    except BaseException as exc:
        import traceback

        emit({"error": describe(exc), "traceback": traceback.format_exc()[-1500:]})


if __name__ == "__main__":
    if sys.argv[1:] == ["judge"]:
        sys.exit(judge_main())
    legacy_main()
