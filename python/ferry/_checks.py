"""The one validator of ferry's numeric keywords (threads=, batch_size=, seq_len=, prefetch=, seed=,
world_size=, rank=, sizes...), called by every public function of ferry, ferry.torch,
ferry.xarray, ferry.checkpoint, ferry.images and ferry.dali before any work starts.

A value out of range is a ValueError naming the function, the keyword and the allowed range; a
value of the wrong type (a str, a float, a bool) is a KeywordTypeError, which is a ValueError and a
TypeError at once (as numpy's AxisError is a ValueError and an IndexError): code catching
either sees it. Sizes ("8M", "5GB") are parsed by the C library (ferry_size_parse); its refusal is
passed on with the keyword's name, not validated twice.

The table RANGES is the contract: tests/python/test_keyword_ranges.py sweeps every public
function's signature with values just outside each keyword's range.
"""
from __future__ import annotations

import operator

_I64 = 1 << 63

# keyword: (lowest, highest, what the edge values mean); None: no bound on that side
RANGES: dict = {
    "threads": (0, 4096, "0: the context's workers"),
    "batch_size": (1, 1 << 31, None),
    "seq_len": (1, 1 << 40, None),
    "prefetch": (0, 1 << 16, "0: read nothing ahead"),
    "batches_per_read": (1, 1 << 20, None),
    "sample_group": (1, 1 << 20, None),
    "block_size": (1, 1 << 62, None),
    "seed": (None, None, "any: the orders hash it"),
    "epoch": (0, _I64 - 1, None),
    "n": (0, _I64 - 1, None),
    "world_size": (1, 1 << 24, None),
    "rank": (0, (1 << 24) - 1, "below world_size"),
    "input_steps": (1, 1 << 31, None),
    "target_steps": (0, 1 << 31, None),
    "lead": (1, 1 << 31, None),
    "stats_steps": (1, 1 << 40, None),
    "keep": (1, 1 << 16, None),
    "num_threads": (1, 4096, None),
    "prefetch_queue_depth": (1, 1 << 16, None),
    "device_id": (0, 1 << 16, None),
    "staging_count": (0, 16, "0: the default"),
}
# keywords that take a size: an int of bytes or a string as ferry_size_parse reads it
SIZES: dict = {
    "max_shard_size": (1, None, None),
    "task_size": (0, None, None),        # ferry.Context's: 0 is the default (FERRY_TASK_SIZE, else built in)
    "staging_size": (0, None, None),
    "small_io": (0, None, None),
    "nbytes": (0, None, None),           # ferry.checkpoint.reserve_pinned's
}

# keywords that take a probability (a real number from 0 to 1)
PROBS: dict = {
    "flip": "the chance of a horizontal flip",
}


class KeywordTypeError(TypeError, ValueError):
    """A keyword of the wrong type: a TypeError, and a ValueError for callers that catch the
    ValueError every bad keyword value raises."""


def _num(v: int) -> str:
    """2**40 rather than 1099511627776: the edges of RANGES are powers of two."""
    a = abs(v)
    if a < 1 << 20:
        return str(v)
    for k, t in ((a.bit_length() - 1, ""), (a.bit_length(), "-1")):
        if (1 << k) - (1 if t else 0) == a:
            return f"{'-' if v < 0 else ''}2**{k}{t}"
    return str(v)


def _range_text(name: str, lo, hi, note, none: bool) -> str:
    r = ("an int" if lo is None else f"an int >= {_num(lo)}") if hi is None else \
        f"an int from {_num(lo)} to {_num(hi)}"
    if note:
        r += f" ({note})"
    return r + (" or None" if none else "")


def check(where: str, name: str, value, *, none: bool = False, hi=None):
    """value as an int within RANGES[name] (or None when none=True); hi= lowers the upper bound
    (rank: world_size - 1). where names the function in the message ("ferry.read")."""
    lo, top, note = RANGES[name]
    if hi is not None:
        top = hi if top is None else min(top, hi)
    if value is None and none:
        return None
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise KeywordTypeError(f"{where}: {name} must be {_range_text(name, lo, top, note, none)}, "
                               f"not {type(value).__name__} {value!r}")
    v = operator.index(value)            # numpy integers pass; floats and strings did not get here
    if (lo is not None and v < lo) or (top is not None and v > top):
        raise ValueError(f"{where}: {name} must be {_range_text(name, lo, top, note, none)}, not {v}")
    return v


def check_size(where: str, name: str, value, *, none: bool = True):
    """Bytes of a size keyword (an int, or "8M"/"5GB" as ferry_size_parse reads it), at least
    SIZES[name]'s lowest; the C parser's refusal is re-raised naming the keyword."""
    from . import _ferry
    lo, _, _ = SIZES[name]
    if value is None and none:
        return None
    if isinstance(value, bool) or not (isinstance(value, str) or hasattr(type(value), "__index__")):
        raise KeywordTypeError(f"{where}: {name} must be a size (bytes as an int, or a string such as "
                               f"\"8M\" or \"5GB\"){' or None' if none else ''}, not {type(value).__name__} "
                               f"{value!r}")
    try:
        n = _ferry.size_parse(value if isinstance(value, str) else operator.index(value))
    except (ValueError, OverflowError) as e:
        raise ValueError(f"{where}: {name}: {e}") from None
    if n < lo:
        raise ValueError(f"{where}: {name} must be at least {lo} byte{'s' if lo != 1 else ''}, not {value!r}")
    return n


def check_prob(where: str, name: str, value) -> float:
    """value as a float from 0 to 1 (PROBS[name] says what it is the chance of)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(type(value), "__float__"):
        raise KeywordTypeError(f"{where}: {name} must be a number from 0 to 1 ({PROBS[name]}), "
                               f"not {type(value).__name__} {value!r}")
    v = float(value)
    if not 0.0 <= v <= 1.0:
        raise ValueError(f"{where}: {name} must be a number from 0 to 1 ({PROBS[name]}), not {v!r}")
    return v
