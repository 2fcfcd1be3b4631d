"""What a prompt variant did to the flagged heads, in plain words: did it move the split down, up or
not at all. Pure functions over :func:`~inspector.investigate.compare_captures` tables."""

from __future__ import annotations

import pandas as pd

UNCHANGED = 0.005  # a split score that moves less than this between variants "did not move"


def move_word(change: float) -> str:
    """``up``, ``down`` or ``not at all`` (a change smaller than :data:`UNCHANGED`)."""
    return "not at all" if abs(change) < UNCHANGED else "up" if change > 0 else "down"


def variant_moves(split: pd.DataFrame, comparisons: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """For every head flagged in the original or in a variant, per variant: its split score before and
    after, the change, and whether the variant moved the split ``down``, ``up`` or ``not at all``
    (original's flagged heads first, in split-table order)."""
    first = split[split["flagged"].astype(bool)]
    order = list(zip(first["site"], first["head"], strict=True))
    rows = []
    for name, df in comparisons.items():
        before, after = "split_score[original]", f"split_score[{name}]"
        if before not in df.columns or after not in df.columns:
            continue
        flagged = df[df["flagged[original]"].astype(bool) | df[f"flagged[{name}]"].astype(bool)]
        for r in flagged.to_dict("records"):
            rows.append({"variant": name, "site": r["site"], "layer": r["layer"], "head": r["head"],
                         "split_before": r[before], "split_after": r[after], "split_change": r["split_change"],
                         "moved": move_word(r["split_change"]), "flagged_before": bool(r["flagged[original]"]),
                         "flagged_after": bool(r[f"flagged[{name}]"])})
    out = pd.DataFrame(rows, columns=["variant", "site", "layer", "head", "split_before", "split_after", "split_change",
                                      "moved", "flagged_before", "flagged_after"])
    rank = {k: i for i, k in enumerate(order)}
    out["_o"] = [rank.get((s, h), len(rank)) for s, h in zip(out["site"], out["head"], strict=True)]
    return out.sort_values(["_o", "variant"], kind="stable").drop(columns="_o").reset_index(drop=True)


def move_sentence(r: dict) -> str:
    """One plain sentence: what the variant did to a head's split."""
    head = f"layer {r['layer']} head {r['head']} ({r['site']})"
    state = {(True, True): "still flagged", (True, False): "no longer flagged", (False, True): "newly flagged",
             (False, False): "not flagged"}[(r["flagged_before"], r["flagged_after"])]
    if r["moved"] == "not at all":
        return (f"Variant {r['variant']!r} did not move the split of {head}: {r['split_before']:.3f} -> {r['split_after']:.3f} "
                f"({state}).")
    verb = "raised" if r["moved"] == "up" else "lowered"
    tail = " It did not help this head." if r["moved"] == "up" else ""
    return (f"Variant {r['variant']!r} {verb} the split of {head}: {r['split_before']:.3f} -> {r['split_after']:.3f} "
            f"({r['split_change']:+.3f}, {state}).{tail}")
