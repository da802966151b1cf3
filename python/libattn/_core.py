"""The framework-free core of the package: contexts, the plan cache, the executor's policy.

Every front-end (libattn.torch, and later others) describes a problem as a tuple of attn_problem's
fields (``Problem``), asks ``get_plan`` for a plan, and runs it through ``_ext.forward`` /
``_ext.backward`` with data pointers and strides. attn.h allows one thread at a time per context,
so each Python thread gets its own context and its own plan cache; a repeated problem costs one
dictionary lookup.
"""

import os
import threading

from . import _ext

Error = _ext.Error
InvalidArgument = _ext.InvalidArgument
Unsupported = _ext.Unsupported

# attn.h's enumerations, as plain integers.
DTYPE_F32, DTYPE_F16, DTYPE_BF16, DTYPE_F64, DTYPE_U8, DTYPE_I32, DTYPE_F8E4M3 = range(7)
OUT_DTYPE_DEFAULT = -1  # attn_problem.out_dtype: the problem's dtype (bf16 for f8e4m3)
DESCALE_NONE, DESCALE_TENSOR, DESCALE_PER_BATCH_KV_HEAD = 0, 1, 2
OP_FLASH, OP_SDPA = 0, 1
DEVICE_CPU, DEVICE_CUDA = 0, 1
ALIGN_BOTTOM_RIGHT, ALIGN_TOP_LEFT = 0, 1
ALIBI_NONE, ALIBI_PER_HEAD, ALIBI_PER_BATCH_HEAD = 0, 1, 2
VARLEN_NONE, VARLEN_PACKED, VARLEN_PADDED = 0, 1, 2
PLATFORMS = {"auto": 0, "ref": 1, "cpu": 2, "cuda": 3, "cudnn": 4}
ON_MISS_HEURISTICS, ON_MISS_AUTOTUNE = 0, 1

# The layouts of a problem tuple (attn_problem's fields) and of an inputs tuple (attn_inputs'), as
# the binding's tables give them (python/src/_ext.c, their one place). A tuple may stop early: the
# fields past its end keep their defaults, so a front-end builds by position the fields it uses.
PROBLEM_FIELDS = _ext.problem_fields()
INPUT_FIELDS = _ext.input_fields()
_DEFAULT_PROBLEM = _ext.problem_default()
_FIELD_INDEX = {name: i for i, name in enumerate(PROBLEM_FIELDS)}


def make_problem(**fields):
    """A problem tuple: attn_problem_init's defaults with the given fields set."""
    values = list(_DEFAULT_PROBLEM)
    for name, value in fields.items():
        values[_FIELD_INDEX[name]] = value
    return tuple(values)


def problem_string(problem):
    """The canonical text of a problem tuple ("b4 hq32 hkv8 sq4096 sk4096 d128 bf16 causal")."""
    return _ext.problem_string(problem)


def parse_problem(text):
    """The problem tuple of a canonical problem string (attn_problem_parse)."""
    return _ext.problem_parse(_thread().ctx, text)


# ---- the executor's policy, shared by every thread's context ----------------------------------

_POLICY_KEYS = ("allow_autotune", "on_miss", "tune_backward", "warmup_iters", "measure_iters",
                "max_seconds", "persist", "cache_path", "deterministic")
_policy_lock = threading.Lock()
_policy = list(_ext.get_policy())  # attn_policy_init's defaults (ATTN_AUTOTUNE=1 is honoured)
_policy_version = 0
_num_threads = 0


class _ThreadState(threading.local):
    def __init__(self):
        self.ctx = _ext.ctx_new()
        self.plans = {}
        self.version = -1


_state = _ThreadState()


def _thread():
    """This thread's context, brought up to date with the process-wide policy."""
    st = _state
    if st.version != _policy_version:
        with _policy_lock:
            policy, version, threads = tuple(_policy), _policy_version, _num_threads
        _ext.set_policy(st.ctx, *policy)
        _ext.set_num_threads(st.ctx, threads)
        # Plans chosen under the old policy (say, by heuristics before autotuning was asked for)
        # are chosen again; the executor's in-memory and file caches make that cheap.
        st.plans.clear()
        st.version = version
    return st


_KEEP = object()


def set_policy(*, autotune=None, allow_autotune=None, tune_backward=None, deterministic=None,
               cache_path=_KEEP, persist=None, warmup_iters=None, measure_iters=None,
               max_seconds=None):
    """Sets the executor's policy for every thread (attn_policy; an argument left out keeps its
    field).

    autotune: True times the candidates on a cache miss (on_miss=AUTOTUNE), False takes the
    heuristic pick. allow_autotune: False forbids timing anything. tune_backward: time forward +
    backward (training). deterministic: only configurations that repeat their bits. cache_path:
    the cache file ("" for none; None for the default, $ATTN_CACHE_PATH, else
    $XDG_CACHE_HOME/libattn/cache.txt, else ~/.cache/libattn/cache.txt).
    persist: merge measured results into the file.
    """
    global _policy_version
    changes = {"allow_autotune": allow_autotune, "tune_backward": tune_backward,
               "deterministic": deterministic, "cache_path": cache_path, "persist": persist,
               "warmup_iters": warmup_iters, "measure_iters": measure_iters,
               "max_seconds": max_seconds,
               "on_miss": None if autotune is None else
               (ON_MISS_AUTOTUNE if autotune else ON_MISS_HEURISTICS)}
    with _policy_lock:
        new = list(_policy)
        for key, value in changes.items():
            i = _POLICY_KEYS.index(key)
            if key == "cache_path":
                if value is not _KEEP:
                    new[i] = None if value is None else os.fspath(value)
            elif value is None:
                continue
            elif key == "max_seconds":
                new[i] = float(value)
            else:
                new[i] = int(value)
        # Checked by the library before it is shared: a bad value raises here, naming the field.
        _ext.set_policy(_ext.ctx_new(), *new)
        _policy[:] = new
        _policy_version += 1


def get_policy():
    """The executor's policy as a dict (the keys of set_policy, plus on_miss)."""
    with _policy_lock:
        d = dict(zip(_POLICY_KEYS, _policy))
    d["autotune"] = d["on_miss"] == ON_MISS_AUTOTUNE
    for key in ("allow_autotune", "tune_backward", "persist", "deterministic"):
        d[key] = bool(d[key])
    return d


def set_num_threads(n):
    """Threads the CPU implementations may use (0: the implementation's choice)."""
    global _num_threads, _policy_version
    _ext.set_num_threads(_ext.ctx_new(), int(n))
    with _policy_lock:
        _num_threads = int(n)
        _policy_version += 1


# ---- plans ---------------------------------------------------------------------------------------


class Plan:
    """A planned problem: the capsule, the chosen implementation and its workspace sizes."""

    __slots__ = ("capsule", "problem", "impl", "config", "forward_workspace",
                 "backward_workspace")

    def __init__(self, capsule, problem):
        self.capsule = capsule
        self.problem = problem
        self.impl, self.config, self.forward_workspace, self.backward_workspace = \
            _ext.plan_info(capsule)

    def __repr__(self):
        return (f"Plan({problem_string(self.problem)!r}, impl={self.impl!r}, "
                f"config={self.config!r})")


def get_plan(problem, impl=None, config=None, platform=0, deterministic=False):
    """The plan of a problem for this thread, created on first use and cached after."""
    st = _thread()
    key = (problem, impl, config, platform, deterministic)
    plan = st.plans.get(key)
    if plan is not None:
        return plan
    return _create_plan(st, key)


def _create_plan(st, key):
    problem, impl, config, platform, deterministic = key
    if deterministic and not _policy[_POLICY_KEYS.index("deterministic")]:
        # A call that asks for determinism (FlashAttention's deterministic=True) plans under a
        # policy that says so, without changing the process-wide one.
        policy = list(_ext.get_policy(st.ctx))
        policy[_POLICY_KEYS.index("deterministic")] = 1
        _ext.set_policy(st.ctx, *policy)
        try:
            capsule = _ext.plan_new(st.ctx, problem, impl, config, platform, 0)
        finally:
            policy[_POLICY_KEYS.index("deterministic")] = 0
            _ext.set_policy(st.ctx, *policy)
    else:
        capsule = _ext.plan_new(st.ctx, problem, impl, config, platform, 0)
    plan = Plan(capsule, problem)
    if len(st.plans) >= _MAX_PLANS:
        # Varlen batches bring new totals every step: the cache is bounded, and a plan made again
        # is found in the executor's own cache.
        st.plans.clear()
    st.plans[key] = plan
    return plan


_MAX_PLANS = 4096


def remember(key, value):
    """Keeps a front-end's entry (a plan and what it derived) beside this thread's plans, so a
    change of policy forgets both."""
    st = _thread()
    if len(st.plans) >= _MAX_PLANS:
        st.plans.clear()
    st.plans[key] = value


def plan(problem, *, impl=None, config=None, platform="auto", deterministic=False):
    """The plan libattn makes for a problem (a canonical string or a problem tuple): which
    implementation and configuration run it. Cached like the front-ends' plans."""
    if isinstance(problem, str):
        problem = parse_problem(problem)
    return get_plan(problem, impl, config, _platform(platform), bool(deterministic))


def tune(problem, *, backward=False, impl=None, platform="auto"):
    """Tunes a problem ahead of time: times every candidate (whatever the policy's on_miss says)
    and keeps the winner in this thread's memory and, when the policy persists, in the cache file,
    where every thread and process finds it. Returns the Plan. A problem already in the cache is
    not timed again."""
    if isinstance(problem, str):
        problem = parse_problem(problem)
    st = _thread()
    saved = list(_ext.get_policy(st.ctx))
    tuned = list(saved)
    tuned[_POLICY_KEYS.index("allow_autotune")] = 1
    tuned[_POLICY_KEYS.index("on_miss")] = ON_MISS_AUTOTUNE
    tuned[_POLICY_KEYS.index("tune_backward")] = int(bool(backward))
    _ext.set_policy(st.ctx, *tuned)
    try:
        capsule = _ext.plan_new(st.ctx, problem, impl, None, _platform(platform), 0)
    finally:
        _ext.set_policy(st.ctx, *saved)
    # Plans this thread made before under the heuristics are chosen again on next use.
    st.plans.clear()
    return Plan(capsule, problem)


def _platform(name):
    if isinstance(name, int):
        return name
    try:
        return PLATFORMS[name or "auto"]
    except KeyError:
        raise ValueError(f"platform={name!r} is not one of {sorted(PLATFORMS)}") from None


# ---- the cache ----------------------------------------------------------------------------------


def cache_info():
    """What the executor's cache holds: the file's path, the number of entries in this thread's
    memory and in the file, and the file's entries as dicts (problem, impl, config, time_us,
    ...)."""
    st = _thread()
    path = _ext.cache(st.ctx, "path")
    memory, disk = _ext.cache(st.ctx, "count")
    return {"path": path, "memory": memory, "disk": disk,
            "entries": read_cache_file(path) if path else []}


_CACHE_COLUMNS = ("fingerprint", "candidates", "pass", "threads", "problem", "impl",
                  "impl_version", "config", "time_us")


def read_cache_file(path):
    """The entries of a cache file ("libattn-cache 1", then one tab-separated entry a line)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    if not lines or not lines[0].startswith("libattn-cache "):
        return []
    entries = []
    for line in lines[1:]:
        fields = line.split("\t")
        if line.startswith("#") or len(fields) != len(_CACHE_COLUMNS):
            continue
        entry = dict(zip(_CACHE_COLUMNS, fields))
        try:
            entry["time_us"] = float(entry["time_us"])
        except ValueError:
            continue
        entries.append(entry)
    return entries


def cache_clear():
    """Forgets this thread's in-memory cache and plans (the file is untouched)."""
    st = _thread()
    _ext.cache(st.ctx, "clear")
    st.plans.clear()


def cache_import(path):
    """Reads a cache file's entries into this thread's in-memory cache."""
    _ext.cache(_thread().ctx, "import", os.fspath(path))
    _state.plans.clear()


def cache_export(path):
    """Merges this thread's in-memory entries and the cache file's into the file at path."""
    _ext.cache(_thread().ctx, "export", os.fspath(path))
