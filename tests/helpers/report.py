"""The HTML report as the report tests read it: its DOM, and the legal example's report with a swapped variant and
the comparison of the two (the ``legal`` fixture of conftest.py)."""

from __future__ import annotations

from html.parser import HTMLParser

from inspector.analysis import rank_heads, split_heads
from inspector.analysis.question import Question
from inspector.capture import capture
from inspector.ui.report import Sections, render_report

from conftest import LEGAL

REFS = ["Lessee", "Lessor"]
COMMANDS = ["inspector capture --text-file lease.txt -o run.safetensors",
            "inspector split run.safetensors --query indemnity --referents Lessee,Lessor"]
SWAPPED = LEGAL.replace("Lessee", "@").replace("Lessor", "Lessee").replace("@", "Lessor")
VOID = {"meta", "br", "hr", "img", "input", "link", "col", "wbr"}


# ---- a small DOM, enough to read the report back --------------------------------------------------
class Node:
    def __init__(self, tag: str, attrs: dict, parent: Node | None):
        self.tag, self.attrs, self.parent, self.children = tag, attrs, parent, []

    @property
    def classes(self) -> set[str]:
        return set((self.attrs.get("class") or "").split())

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def all(self, tag: str | None = None, cls: str | None = None) -> list[Node]:
        out = []
        for c in self.children:
            if isinstance(c, Node):
                if (tag is None or c.tag == tag) and (cls is None or cls in c.classes):
                    out.append(c)
                out += c.all(tag, cls)
        return out


class _Builder(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = self.cur = Node("#root", {}, None)

    def handle_starttag(self, tag, attrs):
        node = Node(tag, dict(attrs), self.cur)
        self.cur.children.append(node)
        if tag not in VOID:
            self.cur = node

    def handle_endtag(self, tag):
        node = self.cur
        while node is not None and node.tag != tag:
            node = node.parent
        if node is not None and node.parent is not None:
            self.cur = node.parent

    def handle_data(self, data):
        self.cur.children.append(data)


def dom(html: str) -> Node:
    b = _Builder()
    b.feed(html)
    b.close()
    return b.root


def report_of(cap, query, refs=REFS, occurrence=None, **kw):
    split = split_heads(cap, Question(query, refs, occurrence=occurrence))
    rank = rank_heads(cap)
    html = render_report(cap, split, rank, Question(query, tuple(refs)), commands=COMMANDS, sections=Sections(**kw))
    return {"cap": cap, "split": split, "rank": rank, "html": html, "dom": dom(html), "query": query}


def legal_report(minilm) -> dict:
    """The legal example's report, with the swapped variant and the comparison of the two."""
    cap = capture(minilm.model, minilm.tokenizer, LEGAL)
    swapped = capture(minilm.model, minilm.tokenizer, SWAPPED)
    a = split_heads(cap, Question("indemnity", REFS))[["site", "head", "split_score"]]
    b = split_heads(swapped, Question("indemnity", REFS))[["site", "head", "split_score"]]
    comp = a.merge(b, on=["site", "head"], suffixes=(":original", ":swapped"))
    comp["change"] = comp["split_score:swapped"] - comp["split_score:original"]
    comp = comp.sample(frac=1.0, random_state=0).reset_index(drop=True)  # the report sorts it
    out = report_of(cap, "indemnity", comparison=comp, variants={"original": cap, "swapped": swapped})
    out["comparison"] = comp
    return out
