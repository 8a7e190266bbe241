"""Human-readable output of the CLI's tierd controls (``stats``, ``drain``).

``--json`` prints tierd's answer as it is; these functions turn the same mapping into a few
aligned lines: sizes as ``64.0 GiB``, counters with separators, only the counters that moved.
Pure functions over plain data; they import nothing but ``config.format_size``.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from .config import format_size

# Shown in a tier's headline, so left out of its counter line.
_HEADLINE = {"used_bytes", "budget_bytes", "direct_io", "backlog", "queue_max", "breaker"}


def _value(key: str, v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int) and (key == "bytes" or key.endswith("_bytes") or key.startswith("bytes_")):
        return format_size(v)
    if isinstance(v, float) and key.endswith("_Bps"):
        return f"{format_size(int(v))}/s"
    if isinstance(v, float) and key.endswith("_s"):
        return f"{v * 1000:.1f} ms" if v < 1 else f"{v:.1f} s"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, Mapping):
        return "(" + _pairs(v, only_moved=False) + ")"
    return str(v)


def _pairs(d: Mapping[str, Any], *, only_moved: bool = True, skip: frozenset[str] | set[str] = frozenset()) -> str:
    shown = [(k, v) for k, v in d.items() if k not in skip and not (only_moved and v in (0, 0.0, None))]
    if not shown:
        return "no activity yet"
    return ", ".join(f"{k.replace('_', ' ')} {_value(k, v)}" for k, v in shown)


def _tier_headline(name: str, t: Mapping[str, Any], index: Mapping[str, Any]) -> str:
    held = f"holds {int(index.get('chunks', 0)):,} chunk(s) ({format_size(int(index.get('bytes', 0)))})" if index else ""
    if name == "nvme" and "budget_bytes" in t:
        used, budget = int(t.get("used_bytes", 0)), int(t["budget_bytes"])
        pct = 100.0 * used / budget if budget else 0.0
        io = "direct I/O" if t.get("direct_io") else "buffered I/O"
        return f"{format_size(used)} of {format_size(budget)} used ({pct:.1f}%), {held}, {io}"
    if name == "s3" and "backlog" in t:
        return (f"backlog {int(t['backlog']):,} of {int(t.get('queue_max', 0)):,} chunk(s), "
                f"breaker {t.get('breaker', '?')}, {held}")
    return held


def render_stats(stats: Mapping[str, Any]) -> str:
    """tierd's ``stats`` answer as aligned lines for a terminal."""
    lines = [f"{'chunks':<8} {int(stats.get('chunks_indexed', 0)):,} indexed in lower tiers, "
             f"{int(stats.get('leases', 0)):,} lease(s)"]
    index = stats.get("index") or {}
    for name in ("nvme", "s3"):
        tier = stats.get(name)
        if not isinstance(tier, Mapping):
            lines.append(f"{name:<8} off")
            continue
        lines.append(f"{name:<8} {_tier_headline(name, tier, index.get(name) or {})}")
        lines.append(f"{'':<8} {_pairs(tier, skip=_HEADLINE)}")
    if isinstance(stats.get("manager"), Mapping):
        lines.append(f"{'manager':<8} {_pairs(stats['manager'])}")
    cost = stats.get("cost")
    if isinstance(cost, Mapping) and cost:
        lines.append(f"{'cost':<8} " + "; ".join(
            f"{tier} {_value('latency_s', float(c.get('latency_s', 0.0)))} + "
            f"{_value('bandwidth_Bps', float(c.get('bandwidth_Bps', 0.0)))}"
            for tier, c in cost.items() if isinstance(c, Mapping)))
    known = {"chunks_indexed", "leases", "index", "nvme", "s3", "manager", "cost"}
    for key, v in stats.items():  # anything a newer tierd adds
        if key not in known:
            lines.append(f"{key:<8} {_value(key, v)}")
    return "\n".join(lines)


def describe_backlog(stats: Optional[Mapping[str, Any]]) -> str:
    """One phrase for ``drain``'s progress lines."""
    if stats is None:
        return "tierd busy (no stats this time)"
    s3 = stats.get("s3")
    if not isinstance(s3, Mapping):
        return "no S3 tier configured"
    return f"{int(s3.get('backlog', 0)):,} chunk(s) still to flush to S3 (breaker {s3.get('breaker', '?')})"


__all__ = ["render_stats", "describe_backlog"]
