"""libattn: exact attention kernels (flash attention / SDPA, forward and backward).

The C library, its implementations (ref, cpu, and the GPU modules when they were built) and one
binding (_ext) shared by every framework front-end. The PyTorch front-end is ``libattn.torch``:

    from libattn.torch import flash_attn_func, scaled_dot_product_attention, attention

and the JAX front-end (XLA FFI handlers, ejKernel's interface) is ``libattn.jax``:

    from libattn.jax import flash_attention, scaled_dot_product_attention

``info()`` says what this installation found; ``set_policy``, ``tune`` and ``cache_info`` drive
the executor that picks an implementation per problem. docs/PYTHON.md in the source tree has the
rest.
"""

from . import _ext
from ._core import (Error, InvalidArgument, Plan, Unsupported, cache_clear, cache_export,
                    cache_import, cache_info, get_policy, parse_problem, plan, problem_string,
                    set_num_threads, set_policy, tune)

__version__ = _ext.version()

__all__ = ["Error", "InvalidArgument", "Unsupported", "Plan", "info", "plan", "tune",
           "set_policy", "get_policy", "set_num_threads", "cache_info", "cache_clear",
           "cache_import", "cache_export", "parse_problem", "problem_string", "__version__"]

_CPU_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16")


def _cpu_features():
    """The x86 features the cpu implementation dispatches on, from /proc/cpuinfo (Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return [flag for flag in _CPU_FLAGS if flag in flags]
    except OSError:
        pass
    return []


def info():
    """What this installation has: a dict with the library's version, its folder, the registered
    implementations (name, platform, device, version), the CPU's features, and the GPU modules
    (name, loaded, path, and the reason one did not load)."""
    import os

    impls = [{"name": n, "platform": p, "device": d, "version": v}
             for n, p, d, v in _ext.registry()]
    result = {"version": __version__, "path": os.path.dirname(_ext.__file__),
              "implementations": impls, "cpu_features": _cpu_features()}
    result["modules"] = _ext.modules()
    return result
