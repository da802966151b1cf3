"""The package itself: info(), the executor's policy, tuning ahead of time, the cache."""
import os

import pytest

import libattn


def test_info():
    info = libattn.info()
    assert info["version"] == libattn.__version__ and info["version"].count(".") == 2
    names = [i["name"] for i in info["implementations"]]
    assert names[-1] == "ref" and "cpu" in names
    assert os.path.exists(os.path.join(info["path"], "libattn.so"))
    assert isinstance(info["cpu_features"], list) and isinstance(info["modules"], list)
    # Every GPU module is listed, loaded or not; one that did not load says why, and a loaded one
    # is the file beside libattn.so that put its implementation in the registry.
    assert sorted(m["name"] for m in info["modules"]) == ["cuda", "cudnn"]
    for m in info["modules"]:
        if m["loaded"]:
            assert m["name"] in names and m["reason"] == ""
        else:
            assert m["name"] not in names and m["reason"] != ""


def test_policy_round_trip():
    before = libattn.get_policy()
    try:
        libattn.set_policy(autotune=True, tune_backward=True, deterministic=True, max_seconds=0.5)
        p = libattn.get_policy()
        assert p["autotune"] and p["tune_backward"] and p["deterministic"]
        assert p["max_seconds"] == 0.5
        with pytest.raises(libattn.InvalidArgument, match="max_seconds"):
            libattn.set_policy(max_seconds=-1)
        assert libattn.get_policy() == p  # a refused policy changes nothing
    finally:
        libattn.set_policy(autotune=before["autotune"], tune_backward=before["tune_backward"],
                           deterministic=before["deterministic"], max_seconds=before["max_seconds"])


def test_tune_ahead_of_time_and_read_the_cache(tmp_path):
    before = libattn.get_policy()
    path = str(tmp_path / "cache.txt")
    try:
        libattn.set_policy(cache_path=path, max_seconds=0.05, warmup_iters=1, measure_iters=3)
        problem = "b1 hq2 sq33 d16 causal"
        plan = libattn.tune(problem)
        assert plan.impl in ("cpu", "ref")
        info = libattn.cache_info()
        assert info["path"] == path and info["disk"] >= 1 and info["memory"] >= 1
        entry = [e for e in info["entries"] if e["problem"].startswith("b1 hq2 hkv2 sq33")]
        assert entry and entry[0]["impl"] == plan.impl and entry[0]["time_us"] > 0
        # The plan the front-ends make for it now comes from the cache (the cache keys the pass:
        # a forward tuning serves a policy that tunes the forward only, the default).
        assert libattn.plan(problem).impl == plan.impl
        trained = libattn.tune(problem, backward=True)
        assert len(libattn.cache_info()["entries"]) == 2
        libattn.set_policy(tune_backward=True)
        assert libattn.plan(problem).impl == trained.impl
        exported = str(tmp_path / "copy.txt")
        libattn.cache_export(exported)
        libattn.cache_clear()
        libattn.cache_import(exported)
        assert libattn.cache_info()["memory"] >= 1
        libattn.set_policy(cache_path=None)  # the default: $ATTN_CACHE_PATH (conftest.py)
        assert libattn.cache_info()["path"] == os.environ["ATTN_CACHE_PATH"]
    finally:
        libattn.set_policy(cache_path=before["cache_path"], max_seconds=before["max_seconds"],
                           tune_backward=before["tune_backward"],
                           warmup_iters=before["warmup_iters"],
                           measure_iters=before["measure_iters"])


def test_plans_are_cached_per_problem():
    a = libattn.plan("b2 hq4 hkv2 sq5 sk7 d8")
    assert libattn.plan("b2 hq4 hkv2 sq5 sk7 d8") is a
    assert libattn.plan("b2 hq4 hkv2 sq5 sk7 d8", impl="ref").impl == "ref"
    with pytest.raises(libattn.InvalidArgument, match="bogus"):
        libattn.plan("b2 bogus")


def test_readme_example_runs():
    """The README's Python example, as written there."""
    import pathlib

    text = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = text.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(block, "README.md", "exec"), {})
