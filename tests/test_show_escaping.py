"""HTML from inspector.ui.show carries hostile capture text as data, never as markup or script (issue 22):
Altair figures saved as HTML and bertviz's head and model views returned as HTML, with tokens such as
``</script>``, ``<!--<script>``, quotes, backticks, ``${}`` and Markdown links. Each page is parsed
(html.parser): every token appears only inside the one inline script's JSON, escaped, and reads back as
itself; no element or attribute outside that JSON holds it, and nothing is fetched from a remote host."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest

from inspector.analysis.question import Question
from inspector.store import load
from inspector.ui import show, vega_text

import hostile

TOKENS = ["</script><script>alert(1)</script>", "<!--<script>", "\"'`${alert(2)}`", "![x](http://127.0.0.1:9/x.png)",
          "[l](javascript:alert(3))", "<img src=x onerror=alert(4)>", "a\u2028b"]


class Page(HTMLParser):
    """Start tags with their attributes, and each script's text."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "script":
            self._in_script = True
            self.scripts.append("")

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.scripts[-1] += data


@pytest.fixture(scope="module")
def cap(tmp_path_factory):
    def edit(meta, tensors):
        meta["inputs"][0]["tokens"] = TOKENS[: len(meta["inputs"][0]["tokens"])]
        return tensors

    path = hostile.rewrite(tmp_path_factory.mktemp("hostile") / "h.safetensors", edit)
    return load(path)


def check_page(page: str, tokens: list[str]) -> None:
    parsed = Page()
    parsed.feed(page)
    parsed.close()
    scripts = [t for t, _ in parsed.tags if t == "script"]
    img = [a for t, a in parsed.tags if t == "img"]
    assert not img, img  # a token never became an element
    for tag, attrs in parsed.tags:
        for name, value in attrs.items():
            assert not name.startswith("on"), (tag, name)
            assert not (value or "").startswith(("http://", "https://", "//")), (tag, name, value)  # nothing fetched
            for tok in tokens:
                assert tok not in (value or ""), (tag, name, tok)
    for tok in tokens:
        if any(c in tok for c in "<>&"):
            assert tok not in page, tok  # markup characters only escaped (\u003c ...), inside a script's JSON
    text = "".join(parsed.scripts)
    assert len(scripts) >= 1 and "</script" not in text.lower() and "<!--" not in text
    # every token reads back from the JSON it sits in: as itself, or as the data an Altair chart carries
    # (inspector.ui.vega_text: its markup characters percent-coded, decoded by the chart's own transform)
    found = set()
    for m in re.finditer(r'"(?:[^"\\]|\\.)*"', text):
        try:
            value = json.loads(m.group(0))
        except ValueError:
            continue
        for tok in tokens:
            if tok in value or vega_text.encode(tok) in value:
                found.add(tok)
    assert found == set(tokens), set(tokens) - found


def test_altair_figures_saved_as_html_carry_tokens_as_data(cap, tmp_path):
    tokens = cap.inputs[0].tokens
    site = cap.sites[0]
    for chart in (show.head_heatmap(cap, site, 0), show.query_weights(cap, site, 0, len(tokens) - 1)):
        path = show.save(chart, tmp_path / "figure.html")
        page = path.read_text(encoding="utf-8")
        assert "cdn.jsdelivr" not in page and "<script src=" not in page
        check_page(page, [t for t in tokens if t != "a\u2028b"])
        assert [p.name for p in tmp_path.iterdir()] == ["figure.html"]


@pytest.mark.parametrize("view", ["head", "model"])
def test_bertviz_views_returned_as_html_carry_tokens_as_data(cap, view):
    tokens = cap.inputs[0].tokens
    fn = show.head_view if view == "head" else show.model_view
    page = fn(cap, html_action="return").data
    parsed = Page()
    parsed.feed(page)
    assert not [a for t, a in parsed.tags if t == "img"]  # a token never became an element
    for tok in tokens:
        if any(c in tok for c in "<>&"):
            assert tok not in page, tok  # escaped wherever bertviz pasted it (its script, and a comment in it)
    body = "".join(parsed.scripts)
    assert "</script" not in body.lower() and "<!--" not in body
    anchor = "const params = "
    params, _ = json.JSONDecoder().raw_decode(body, body.index(anchor) + len(anchor))
    shown = json.dumps(params, ensure_ascii=False)
    assert [t for t in tokens if json.dumps(t, ensure_ascii=False)[1:-1] in shown] == tokens  # read back as themselves
    with pytest.raises(Exception, match="html_action"):
        fn(cap, html_action="nope")


def test_a_word_explanation_has_an_escaped_notebook_view(cap):
    from inspector.analysis.explain import explain

    site = cap.sites[0]
    exp = explain(cap, Question("@1-2"), site, 0)  # two query rows whose tokens are "<!--<script>" and "</script>..."
    assert len(exp.rows) == 2
    page = exp._repr_html_()
    parsed = Page()
    parsed.feed(page)
    assert not [t for t, _ in parsed.tags if t in ("script", "img", "a")]
    for tok in cap.inputs[0].tokens:
        if any(c in tok for c in "<>&"):
            assert tok not in page, tok
    assert "inspector WordExplanation" in page and len(parsed.tags) > 10
    assert len(page) < 4 * len(exp.rows[0]._repr_html_()) * max(1, len(exp.rows))
