"""CPU layer: the compiled-kernel cache's key (qrgen.compile.nvrtc.cache_key), without NVRTC."""
from qrgen.compile.nvrtc import cache_key


def test_cache_key_changes_with_every_input():
    base = dict(source="x", arch="sm_90", opts=("-a",), compiler=(13, 0), version_="1")
    key = cache_key(**base)
    for field, other in [("source", "y"), ("arch", "sm_100"), ("opts", ("-b",)), ("compiler", (13, 1)),
                         ("version_", "2")]:
        assert cache_key(**{**base, field: other}) != key, field
    assert cache_key(**base) == key
