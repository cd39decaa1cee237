"""The function templates packages are built from, each with its tests and the bugs it can take.

A template is the source of one function (sometimes a helper and its caller) with ``$``
placeholders for the names and constants a package draws, the calls its tests make (the
expected values come from running the correct code, see ``package.py``), and the bugs that
can be seeded into it: a textual replacement of the correct snippet by the bugged one, in
one of ``BUG_KINDS``. A bug's ``new`` text is also the anchor its fix replaces, so it is
written with enough context to occur once in the bugged module.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["BUG_KINDS", "TEMPLATES", "THEMES", "Bug", "FunctionTemplate", "Theme"]

BUG_KINDS = (
    "off_by_one",
    "wrong_operator",
    "wrong_comparison",
    "missing_case",
    "swapped_arguments",
)
"""Every kind of seeded bug; ``make_tasks`` produces each of them."""


@dataclass(frozen=True, slots=True)
class Bug:
    """Replace ``old`` (correct, in the template) by ``new`` (bugged); the fix is the reverse."""

    kind: str
    old: str
    new: str


@dataclass(frozen=True, slots=True)
class FunctionTemplate:
    """One function (or helper + caller) of a package module."""

    key: str
    """A stable name for the template (not the drawn function name)."""
    names: dict[str, tuple[str, ...]]
    """Placeholder -> name choices; ``fn`` is the function the tests are named after."""
    source: str
    tests: tuple[tuple[str, str], ...]
    """(case, call expression): each becomes ``test_<fn>_<case>``."""
    bugs: tuple[Bug, ...]
    constants: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Placeholder -> literal choices (source text)."""


@dataclass(frozen=True, slots=True)
class Theme:
    """A kind of package: its name stems, module names and the templates it draws from."""

    stems: tuple[str, ...]
    modules: tuple[str, ...]
    templates: tuple[str, ...]


def _t(key: str, names: dict[str, tuple[str, ...]], source: str, tests, bugs, constants=None):
    return FunctionTemplate(
        key=key,
        names=names,
        source=source.strip("\n") + "\n",
        tests=tuple(tests),
        bugs=tuple(Bug(*b) for b in bugs),
        constants=constants or {},
    )


_TEMPLATES = [
    _t(
        "clamp",
        {"fn": ("clamp", "bound", "limit", "clip")},
        '''
def $fn(value, low, high):
    """Return value limited to the range [low, high]."""
    if value < low:
        return low
    if value > high:
        return high
    return value
''',
        [
            ("below", "$fn(-5, 0, $hi)"),
            ("above", "$fn($hi + 5, 0, $hi)"),
            ("inside", "$fn(7, 0, $hi)"),
            ("at_edge", "$fn($hi, 0, $hi)"),
        ],
        [
            ("wrong_comparison", "    if value > high:", "    if value < high:"),
            (
                "missing_case",
                "    if value < low:\n        return low\n    if value > high:",
                "    if value > high:",
            ),
        ],
        {"hi": ("10", "20", "50", "100")},
    ),
    _t(
        "mean",
        {"fn": ("mean", "average", "avg")},
        '''
def $fn(values):
    """Return the arithmetic mean of values; raise ValueError when there are none."""
    if not values:
        raise ValueError("$fn() of an empty sequence")
    return sum(values) / len(values)
''',
        [
            ("of_four", "$fn([1, 2, 4, $k])"),
            ("single", "$fn([$k])"),
            ("empty_raises", "$fn([])"),
        ],
        [
            (
                "missing_case",
                '    if not values:\n        raise ValueError("$fn() of an empty sequence")\n'
                "    return sum(values)",
                "    return sum(values)",
            ),
            ("off_by_one", "/ len(values)", "/ (len(values) - 1)"),
            ("wrong_operator", "/ len(values)", "// len(values)"),
        ],
        {"k": ("6", "10", "14")},
    ),
    _t(
        "median",
        {"fn": ("median", "middle_value")},
        '''
def $fn(values):
    """Return the median of values (the mean of the two middle ones for an even count)."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2 == 1:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2
''',
        [
            ("odd", "$fn([$k, 1, 3])"),
            ("even", "$fn([8, 2, 4, $k])"),
            ("unsorted", "$fn([9, 1, 5, 3, 7])"),
        ],
        [
            (
                "off_by_one",
                "(ordered[mid - 1] + ordered[mid])",
                "(ordered[mid] + ordered[mid + 1])",
            ),
            ("wrong_comparison", "% 2 == 1:", "% 2 == 0:"),
            ("missing_case", "ordered = sorted(values)", "ordered = list(values)"),
        ],
        {"k": ("5", "6", "12")},
    ),
    _t(
        "window",
        {"fn": ("window", "sliding", "windows")},
        '''
def $fn(items, size):
    """Return every run of `size` consecutive items, in order."""
    return [items[i : i + size] for i in range(len(items) - size + 1)]
''',
        [
            ("pairs", "$fn([1, 2, 3, 4], 2)"),
            ("whole", "$fn([1, 2, 3], 3)"),
            ("too_short", "$fn([1, 2], 3)"),
        ],
        [("off_by_one", "range(len(items) - size + 1)", "range(len(items) - size)")],
    ),
    _t(
        "running_total",
        {"fn": ("running_total", "cumulative", "prefix_sums")},
        '''
def $fn(values):
    """Return the running totals of values: [a, a + b, a + b + c, ...]."""
    totals = []
    current = 0
    for value in values:
        current += value
        totals.append(current)
    return totals
''',
        [("three", "$fn([$k, 2, 3])"), ("empty", "$fn([])")],
        [("wrong_operator", "        current += value", "        current -= value")],
        {"k": ("1", "4", "7")},
    ),
    _t(
        "shares",
        {"fn": ("shares", "proportions", "split_shares"), "helper": ("percent_of", "percentage")},
        '''
def $helper(part, whole):
    """Return part as a percentage of whole, rounded to one decimal."""
    return round(100 * part / whole, 1)


def $fn(values):
    """Return each value's share of the total, as percentages."""
    total = sum(values)
    return [$helper(value, total) for value in values]
''',
        [("helper_third", "$helper(1, 3)"), ("halves", "$fn([1, 1, 2])")],
        [
            ("swapped_arguments", "$helper(value, total)", "$helper(total, value)"),
            ("wrong_operator", "100 * part / whole", "100 * part // whole"),
        ],
    ),
    _t(
        "truncate",
        {"fn": ("truncate", "shorten", "ellipsize")},
        '''
def $fn(text, width):
    """Shorten text to at most width characters, ending with '$ell' when it is cut."""
    if len(text) <= width:
        return text
    return text[: width - len("$ell")] + "$ell"
''',
        [
            ("short", '$fn("hello", 10)'),
            ("exact", '$fn("hello", 5)'),
            ("cut", '$fn("hello world", 8)'),
        ],
        [
            ("wrong_comparison", "if len(text) <= width:", "if len(text) < width:"),
            ("off_by_one", 'text[: width - len("$ell")]', 'text[: width - len("$ell") + 1]'),
        ],
        {"ell": ("...", "~", "..")},
    ),
    _t(
        "initials",
        {"fn": ("initials", "monogram")},
        '''
def $fn(name):
    """Return the upper-case first letters of the words of a name, joined by '$sep'."""
    return "$sep".join(part[0].upper() for part in name.split())
''',
        [("two_words", '$fn("ada lovelace")'), ("three_words", '$fn("Grace Brewster Hopper")')],
        [("off_by_one", "part[0].upper()", "part[1].upper()")],
        {"sep": ("", ".", "-")},
    ),
    _t(
        "palindrome",
        {"fn": ("is_palindrome", "reads_same_backwards")},
        '''
def $fn(text):
    """Return True when text reads the same backwards, ignoring case and spaces."""
    letters = [c.lower() for c in text if c != " "]
    return letters == letters[::-1]
''',
        [
            ("simple", '$fn("level")'),
            ("mixed_case", '$fn("Never odd or even")'),
            ("not_one", '$fn("$word")'),
        ],
        [
            ("missing_case", "[c.lower() for c in text", "[c for c in text"),
            (
                "wrong_comparison",
                "return letters == letters[::-1]",
                "return letters != letters[::-1]",
            ),
        ],
        {"word": ("python", "agent", "repository")},
    ),
    _t(
        "slugify",
        {"fn": ("slugify", "to_slug", "make_slug")},
        '''
def $fn(title):
    """Turn a title into a lower-case slug with words joined by '$sep'."""
    return title.strip().lower().replace(" ", "$sep")
''',
        [("two_words", '$fn("Hello World")'), ("padded", '$fn("  Rust  ")')],
        [("swapped_arguments", '.replace(" ", "$sep")', '.replace("$sep", " ")')],
        {"sep": ("-", "_", ".")},
    ),
    _t(
        "clock",
        {"fn": ("format_clock", "as_minutes", "mmss")},
        '''
def $fn(total):
    """Format a number of seconds as 'M:SS' (minutes are not capped at 60)."""
    minutes, seconds = divmod(total, 60)
    return f"{minutes}:{seconds:02d}"
''',
        [("over_a_minute", "$fn($k)"), ("seconds_only", "$fn(5)"), ("long", "$fn(3600)")],
        [("swapped_arguments", "divmod(total, 60)", "divmod(60, total)")],
        {"k": ("75", "95", "130")},
    ),
    _t(
        "chunk",
        {"fn": ("chunk", "batched", "split_every")},
        '''
def $fn(items, size):
    """Split items into lists of `size` items; the last one may be shorter."""
    if size < 1:
        raise ValueError("size must be at least 1")
    return [items[i : i + size] for i in range(0, len(items), size)]
''',
        [
            ("even", "$fn([1, 2, 3, 4], 2)"),
            ("ragged", "$fn([1, 2, 3, 4, 5], $k)"),
            ("negative_size_raises", "$fn([1, 2, 3], -2)"),
        ],
        [
            (
                "missing_case",
                '    if size < 1:\n        raise ValueError("size must be at least 1")\n'
                "    return [items",
                "    return [items",
            ),
            ("off_by_one", "range(0, len(items), size)", "range(1, len(items), size)"),
            ("wrong_comparison", "if size < 1:", "if size > 1:"),
        ],
        {"k": ("2", "3")},
    ),
    _t(
        "rotate",
        {"fn": ("rotate", "rotate_left", "shift")},
        '''
def $fn(items, steps):
    """Rotate items left by steps positions, wrapping around."""
    if not items:
        return []
    steps %= len(items)
    return items[steps:] + items[:steps]
''',
        [
            ("by_one", "$fn([1, 2, 3, 4], 1)"),
            ("wraps", "$fn([1, 2, 3], $k)"),
            ("empty", "$fn([], 2)"),
        ],
        [
            (
                "missing_case",
                "    if not items:\n        return []\n    steps %=",
                "    steps %=",
            ),
            ("wrong_operator", "steps %= len(items)", "steps //= len(items)"),
        ],
        {"k": ("4", "5", "7")},
    ),
    _t(
        "dedupe",
        {"fn": ("dedupe", "unique", "distinct")},
        '''
def $fn(items):
    """Return items without repeats, keeping the first occurrence of each."""
    seen = set()
    result = []
    for item in items:
        if item not in seen:
            seen.add(item)
            result.append(item)
    return result
''',
        [("repeats", "$fn([3, 1, 3, 2, 1])"), ("no_repeats", "$fn([$k, 5])")],
        [
            (
                "missing_case",
                "            seen.add(item)\n            result.append(item)",
                "            result.append(item)",
            ),
            ("wrong_comparison", "if item not in seen:", "if item in seen:"),
        ],
        {"k": ("1", "4", "9")},
    ),
    _t(
        "discount",
        {"fn": ("apply_discount", "discounted", "sale_price")},
        '''
def $fn(price, percent):
    """Return price reduced by percent (0 to 100), rounded to cents."""
    if not 0 <= percent <= 100:
        raise ValueError("percent must be between 0 and 100")
    return round(price * (100 - percent) / 100, 2)
''',
        [
            ("quarter", "$fn($price, 25)"),
            ("none", "$fn(19.99, 0)"),
            ("full", "$fn(50.0, 100)"),
            ("too_much_raises", "$fn(10.0, 150)"),
        ],
        [
            ("wrong_operator", "(100 - percent)", "(100 + percent)"),
            ("wrong_comparison", "0 <= percent <= 100:", "0 <= percent < 100:"),
            (
                "missing_case",
                '    if not 0 <= percent <= 100:\n        raise ValueError("percent must be '
                'between 0 and 100")\n    return round',
                "    return round",
            ),
        ],
        {"price": ("80.0", "40.0", "120.0")},
    ),
    _t(
        "in_bounds",
        {"fn": ("in_bounds", "on_grid", "inside")},
        '''
def $fn(x, y, width, height):
    """Return True when (x, y) is a cell of a width x height grid (0-based)."""
    return 0 <= x < width and 0 <= y < height
''',
        [
            ("corner", "$fn(0, 0, $w, 4)"),
            ("right_edge", "$fn($w, 1, $w, 4)"),
            ("last_cell", "$fn($w - 1, 3, $w, 4)"),
        ],
        [("wrong_comparison", "0 <= x < width", "0 <= x <= width")],
        {"w": ("5", "8", "10")},
    ),
    _t(
        "manhattan",
        {"fn": ("manhattan", "grid_distance", "taxicab")},
        '''
def $fn(a, b):
    """Return the Manhattan distance between points a and b, each an (x, y) pair."""
    return abs(a[0] - b[0]) + abs(a[1] - b[1])
''',
        [("apart", "$fn((1, 2), ($k, 6))"), ("same", "$fn((3, 3), (3, 3))")],
        [
            ("off_by_one", "abs(a[1] - b[1])", "abs(a[1] - b[0])"),
            ("wrong_operator", "abs(a[0] - b[0]) + abs", "abs(a[0] - b[0]) - abs"),
        ],
        {"k": ("4", "7", "9")},
    ),
]

TEMPLATES = {t.key: t for t in _TEMPLATES}

THEMES = (
    Theme(
        stems=("stats", "numkit", "figures", "metrics", "tally"),
        modules=("core", "summary", "series", "ranges"),
        templates=("clamp", "mean", "median", "window", "running_total", "shares"),
    ),
    Theme(
        stems=("textkit", "strutil", "wording", "labels", "prose"),
        modules=("format", "words", "clean", "display"),
        templates=("truncate", "initials", "palindrome", "slugify", "clock"),
    ),
    Theme(
        stems=("listkit", "seqtools", "batches", "seqkit", "groups"),
        modules=("ops", "order", "split", "filters"),
        templates=("chunk", "rotate", "dedupe", "window", "median"),
    ),
    Theme(
        stems=("billing", "checkout", "pricing", "ledger", "invoices"),
        modules=("prices", "totals", "reports"),
        templates=("discount", "shares", "running_total", "clamp", "clock"),
    ),
    Theme(
        stems=("gridkit", "board", "tiles", "mapgrid", "pathing"),
        modules=("cells", "geometry", "moves"),
        templates=("in_bounds", "manhattan", "clamp", "rotate", "dedupe"),
    ),
)
"""Package kinds; a package draws two modules of two or three templates from one theme."""
