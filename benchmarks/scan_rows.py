"""The scan's rows against a reference made by another version of the code (issue 21: the rows unchanged).

Scans the demo corpus (``lease_rows(300)``, as ``inspector scan --demo``) and the contracts corpus of
``benchmarks/scan.py`` (64 documents, ~230 tokens) with the embedded MiniLM, batch 8, and either saves
the ``heads`` and ``documents`` tables (``--save DIR``) or compares them with a saved pair (``--against DIR``):
every float column within 1e-6, every other column equal (texts printed to 4 decimals may differ in the
last digit, as tests/test_scan.py's ``same_text`` allows).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/scan_rows.py --save /tmp/ref     # on the old code
    PYTHONPATH=$PWD .venv/bin/python benchmarks/scan_rows.py --against /tmp/ref  # on the new code
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import _common  # noqa: F401 - offline settings, the checkout on sys.path

TOL = 1e-6
CORPORA = {"demo": 300, "contracts": 64}


def scan_tables(kind: str, n: int, out: Path):
    import pandas as pd

    from inspector.capture.models import load_model
    from inspector.corpus.documents import Fields
    from inspector.corpus.engine import Engine
    from inspector.corpus.leases import lease_rows, write_jsonl
    from inspector.corpus.scan import scan

    if kind == "demo":
        rows = lease_rows(n)
    else:
        from scan import corpus_rows

        rows = corpus_rows("contracts", n)
    data = write_jsonl(out / f"{kind}.jsonl", rows)
    scan(data, out / kind, fields=Fields(query="query", referents="referents", id="id"), engine=Engine(batch_size=8),
         loaded=load_model(None), progress=False)
    heads = pd.read_parquet(out / kind / "heads")
    documents = pd.read_parquet(out / kind / "documents.parquet")
    key = ["id", "site", "head"]
    return heads.sort_values(key).reset_index(drop=True), documents.sort_values("id").reset_index(drop=True)


def _column(x, y, name: str) -> tuple[list[str], float]:
    """The differences of one column (at most one line) and its largest float difference."""
    import numpy as np
    import pandas as pd

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from test_scan import same_text

    if pd.api.types.is_float_dtype(x):
        u, v = x.to_numpy(float), y.to_numpy(float)
        if not np.array_equal(np.isnan(u), np.isnan(v)):
            return [f"{name}: NaN in different rows"], 0.0
        d = float(np.nanmax(np.abs(u - v), initial=0.0))
        return ([f"{name}: max difference {d:.3g}"] if d > TOL else []), d
    if name.endswith("referent_weights"):
        worst = 0.0
        for p, q in zip(x, y, strict=True):
            if (p is None) != (q is None):
                return [f"{name}: missing in different rows"], worst
            if p is not None:
                worst = max(worst, float(np.max(np.abs(np.asarray(p, float) - np.asarray(q, float)), initial=0.0)))
        return ([f"{name}: max difference {worst:.3g}"] if worst > TOL else []), worst
    for p, q in zip(x.astype(str), y.astype(str), strict=True):
        if not same_text(p, q):
            return [f"{name}: {p!r} vs {q!r}"], 0.0
    return [], 0.0


def compare(a, b, what: str) -> list[str]:
    """Every difference between two tables beyond :data:`TOL` (floats) or a last printed digit (texts)."""
    if list(a.columns) != list(b.columns):
        return [f"{what}: columns differ: {list(a.columns)} vs {list(b.columns)}"]
    if len(a) != len(b):
        return [f"{what}: {len(a)} rows vs {len(b)}"]
    bad, worst = [], 0.0
    for col in a.columns:
        lines, d = _column(a[col], b[col], f"{what}.{col}")
        bad += lines
        worst = max(worst, d)
        if str(a[col].dtype) != str(b[col].dtype):
            bad.append(f"{what}.{col}: dtype {a[col].dtype} vs {b[col].dtype}")
    print(f"  {what}: {len(a)} rows, {len(a.columns)} columns, largest float difference {worst:.2g}")
    return bad


def main() -> int:
    ap = argparse.ArgumentParser()
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--save", type=Path)
    g.add_argument("--against", type=Path)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="scan-rows-"))
    bad = []
    for kind, n in CORPORA.items():
        heads, documents = scan_tables(kind, n, tmp)
        if args.save:
            args.save.mkdir(parents=True, exist_ok=True)
            heads.to_parquet(args.save / f"{kind}.heads.parquet")
            documents.to_parquet(args.save / f"{kind}.documents.parquet")
            print(f"saved {kind}: {len(heads)} heads rows, {len(documents)} documents")
            continue
        import pandas as pd

        bad += compare(heads, pd.read_parquet(args.against / f"{kind}.heads.parquet"), f"{kind} heads")
        bad += compare(documents, pd.read_parquet(args.against / f"{kind}.documents.parquet"), f"{kind} documents")
    for line in bad:
        print("  DIFFERS", line)
    if args.against:
        print("rows equal (1e-6)" if not bad else f"{len(bad)} differences")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
