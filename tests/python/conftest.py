"""pytest setup for libattn's Python tests: a private cache file, and one printed seed per test.

The executor's cache file defaults to ~/.cache/libattn/cache.txt; the tests must neither read a
user's tuned entries nor write their own there, so ATTN_CACHE_PATH points into a temporary folder
before libattn is imported.
"""
import os
import random
import tempfile

_cache_dir = tempfile.mkdtemp(prefix="libattn-pytest-")
os.environ["ATTN_CACHE_PATH"] = os.path.join(_cache_dir, "cache.txt")
os.environ.pop("ATTN_AUTOTUNE", None)
# The JAX tests' meshes: 4 host devices, which XLA reads when JAX starts (test_jax.py).
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=4").strip()

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture
def seed(request):
    """A fresh seed per test (ATTN_TEST_SEED repeats one), printed so a failure can be rerun."""
    value = int(os.environ.get("ATTN_TEST_SEED", random.SystemRandom().randrange(1 << 31)))
    torch.manual_seed(value)
    print(f"\n{request.node.name}: seed {value} (rerun with ATTN_TEST_SEED={value})")
    return value
