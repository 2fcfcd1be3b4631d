"""Documents per second of the verdict over an evaluation set (issue 41), side by side with the loop a user would
write instead: one ``debug`` per document (:func:`inspector.investigate.debug.investigate`, what ``inspector debug``
runs, with the same contrast, output and ``--top``), on the same documents of the two trained fixtures'
held-out sets (fixtures/parties/decoder, a GPT-2; fixtures/parties/seq2seq, a BART summariser).

For each fixture:

1. the judged erring documents (the output says WRONG where the contrast is read), through the evaluation scan
   (:func:`inspector.investigate.evaluation.evaluate`, model loaded once, its Parquet folder written) and through the
   per-document ``debug`` loop (each writes its folder and report); the documents per second of both and their
   ratio, and whether the scan's top culprit is the one ``debug`` names first on *every* document;
2. the scan alone on the erring documents and ``--correct N`` correct ones (correct documents cost an attribution
   pass and a capture; erring ones the exact effects too).

Both run in this process with the same torch threads (``--threads``, default 1: the tiny fixtures run fastest on one
thread, and a shared machine's other jobs take the rest). The model load is left out of both.

    .venv/bin/python benchmarks/evaluation.py              # every erring document of both fixtures (a few minutes)
    .venv/bin/python benchmarks/evaluation.py --quick      # 6 erring documents each
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from _common import ROOT, machine_line, table

PARTIES = ROOT / "fixtures" / "parties"


def _items(kind: str) -> list[dict]:
    return json.loads((PARTIES / kind / "heldout.json").read_text())["items"]


def _parties(kind: str, item: dict) -> tuple[str, str]:
    return (item["gold"], item["wrong"]) if kind == "decoder" else (item["right_party"], item["wrong_party"])


def _judged(kind: str, item: dict) -> bool:
    right, wrong = _parties(kind, item)
    said = (item["answer"] if kind == "decoder" else item["output"]).split()
    return not item["right"] and next((w for w in said if w in (right, wrong)), None) == wrong


def _setup(kind: str):
    from inspector.corpus.documents import Fields
    from inspector.investigate.evaluation import Evaluation

    if kind == "decoder":
        return (Fields(text="prompt", target="answer", id="id"),
                Evaluation(right_field="gold", wrong_field="wrong", reference_field="gold"))
    return (Fields(text="source", target="output", id="id"),
            Evaluation(right_field="right_party", wrong_field="wrong_party", reference_field="gold"))


def _write(path: Path, items: list[dict]) -> str:
    path.write_text("".join(json.dumps(x) + "\n" for x in items))
    return str(path)


def _scan(loaded, kind: str, items: list[dict], tmp: Path, name: str):
    from inspector.corpus import verdicts
    from inspector.investigate.evaluation import evaluate

    fields, ev = _setup(kind)
    data = _write(tmp / f"{name}.jsonl", items)
    t0 = time.perf_counter()
    evaluate(data, tmp / name, ev, fields=fields, loaded=loaded, progress=False)
    dt = time.perf_counter() - t0
    return dt, verdicts.read_evaluation(tmp / name)[0].set_index("id")


def _debug_loop(loaded, kind: str, items: list[dict], tmp: Path) -> tuple[float, dict]:
    from inspector.analysis.question import Question
    from inspector.capture.output import Output
    from inspector.investigate.debug import investigate
    from inspector.investigate.defaults import DEBUG_TOP

    named = {}
    t0 = time.perf_counter()
    for item in items:
        right, wrong = _parties(kind, item)
        source = item["prompt" if kind == "decoder" else "source"]
        said = item["answer" if kind == "decoder" else "output"]
        inv = investigate(loaded, source, Question(None, (right, wrong), contrast=(right, wrong)), Output.of(said),
                          out_dir=tmp / f"debug-{item['id']}", top=DEBUG_TOP)
        top = inv.verdict.top
        named[str(item["id"])] = (top["site"], int(top["head"])) if top is not None else None
    return time.perf_counter() - t0, named


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="6 erring documents per fixture")
    ap.add_argument("--correct", type=int, default=20, help="correct documents besides the erring ones in part 2")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = ap.parse_args()
    import torch

    from inspector.capture.models import load_model

    print(machine_line())
    torch.set_num_threads(args.threads)
    print(f"torch threads: {torch.get_num_threads()}")
    rows, mixed, agree_all = [], [], True
    with tempfile.TemporaryDirectory() as tmp_:
        tmp = Path(tmp_)
        for kind in ("decoder", "seq2seq"):
            loaded = load_model(str(PARTIES / kind))
            items = _items(kind)
            erring = [x for x in items if _judged(kind, x)][: 6 if args.quick else None]
            _scan(loaded, kind, erring[:1], tmp, f"{kind}-warm")  # first passes (lazy imports, allocator)
            dt_scan, docs = _scan(loaded, kind, erring, tmp, f"{kind}-erring")
            dt_loop, named = _debug_loop(loaded, kind, erring, tmp)
            mine = {i: (r["culprit_site"], int(r["culprit_head"])) if isinstance(r["culprit_site"], str) else None
                    for i, r in docs.iterrows()}
            agree = sum(mine[i] == named[i] for i in named)
            agree_all &= agree == len(named)
            n = len(erring)
            rows.append([kind, n, f"{n / dt_scan:.2f}", f"{n / dt_loop:.2f}", f"{dt_loop / dt_scan:.1f}x",
                         f"{agree} of {n}"])
            right = [x for x in items if x["right"]][: args.correct]
            dt_mix, _ = _scan(loaded, kind, erring + right, tmp, f"{kind}-mixed")
            mixed.append([kind, f"{n} + {len(right)}", f"{(n + len(right)) / dt_mix:.2f}"])
    print("\nThe judged erring documents: the evaluation scan against one debug per document")
    print(table(["fixture", "documents", "scan docs/s", "debug loop docs/s", "scan / loop", "same top culprit"], rows))
    print("\nThe scan on erring + correct documents")
    print(table(["fixture", "erring + correct", "scan docs/s"], mixed))
    print("\nthe top culprit is debug's on every document" if agree_all else "\nTHE TOP CULPRIT DIFFERS FROM DEBUG'S")


if __name__ == "__main__":
    main()
