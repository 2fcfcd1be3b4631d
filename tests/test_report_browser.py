"""The report in Debian's Chromium, offline: it fetches nothing, and its heatmap and tables show."""

from __future__ import annotations

import re

from inspector.analysis import rank_heads, split_heads
from inspector.analysis.question import Question
from inspector.capture import capture
from inspector.ui.report import render_report

from conftest import LEGAL
from helpers.browser import MARKS, launch

pytestmark = MARKS


def test_report_renders_offline(minilm, tmp_path):
    from playwright.sync_api import sync_playwright

    cap = capture(minilm.model, minilm.tokenizer, LEGAL)
    split = split_heads(cap, Question("indemnity", ["Lessee", "Lessor"]))
    html = render_report(cap, split, rank_heads(cap), Question("indemnity", tuple(["Lessee", "Lessor"])), commands=["inspector split run.safetensors --query indemnity --referents Lessee,Lessor"])
    page_path = tmp_path / "report.html"
    page_path.write_text(html, encoding="utf-8")
    # The CSP would block a stray fetch before the route below sees it; a copy without it shows the markup
    # itself asks for nothing.
    bare = tmp_path / "report-no-csp.html"
    bare.write_text(re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", html), encoding="utf-8")
    assert "Content-Security-Policy" not in bare.read_text(encoding="utf-8")

    outside: list[str] = []

    def gate(route):
        url = route.request.url
        if url.startswith("file://"):
            route.continue_()
        else:
            outside.append(url)
            route.abort()

    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.route("**/*", gate)
            page.on("request", lambda r: None if r.url.startswith(("file://", "data:")) else outside.append(r.url))
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)  # CSP refusals
            page.goto(bare.as_uri(), wait_until="load")
            page.wait_for_load_state("networkidle")
            page.goto(page_path.as_uri(), wait_until="load")
            page.wait_for_load_state("networkidle")

            heat = page.locator("table.hm").first
            assert heat.is_visible()
            box = heat.bounding_box()
            assert box and box["width"] > 200 and box["height"] > 200
            cell = page.locator("table.hm td").first
            assert cell.is_visible()
            shade = page.locator("table.hm td").evaluate_all(
                "tds => tds.map(td => getComputedStyle(td).backgroundColor)")
            assert len(set(shade)) > 5  # cells are coloured by weight
            assert page.locator("table.split").is_visible() and page.locator("table.steps").is_visible()
            assert page.locator("div.src").first.is_visible()
            assert "encoder.layer.5.attention.self" in page.locator("div.head").first.inner_text()
            assert page.title().startswith("Attention report")
            shot = tmp_path / "report.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
        finally:
            browser.close()
    assert outside == [], f"the report tried to fetch {outside}"
    assert errors == []


def test_wide_tables_scroll_inside_their_box(minilm, tmp_path):
    """At a 1000 x 900 window no table runs past the page edge: wide ones scroll inside their box; the bar
    charts are drawn (inline SVG) within the page."""
    from playwright.sync_api import sync_playwright

    cap = capture(minilm.model, minilm.tokenizer, LEGAL)
    split = split_heads(cap, Question("indemnity", ["Lessee", "Lessor"]))
    html = render_report(cap, split, rank_heads(cap), Question("indemnity", tuple(["Lessee", "Lessor"])), commands=[])
    page_path = tmp_path / "report.html"
    page_path.write_text(html, encoding="utf-8")
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport={"width": 1000, "height": 900})
            page.goto(page_path.as_uri(), wait_until="load")
            width = page.evaluate("document.documentElement.clientWidth")
            assert page.evaluate("document.documentElement.scrollWidth") <= width  # nothing sticks out of the page
            boxes = page.locator("div.scroll").evaluate_all(
                "ds => ds.map(d => ({right: d.getBoundingClientRect().right, scroll: d.scrollWidth, client: d.clientWidth,"
                " table: d.querySelector('table').getBoundingClientRect().width, cls: d.querySelector('table').className}))")
            assert boxes and all(b["right"] <= width for b in boxes)
            wide = [b for b in boxes if b["table"] > b["client"] + 1]
            assert any("rank" in b["cls"] or "split" in b["cls"] for b in wide)  # the wide ones are there, ...
            assert all(b["scroll"] >= b["table"] - 1 for b in wide)  # ... and reachable by scrolling their box
            plot = page.locator("div.referent-plot svg")
            assert plot.is_visible()
            box = plot.bounding_box()
            assert box["x"] + box["width"] <= width and box["height"] > 100
            assert plot.locator("path[aria-roledescription='bar']").count() >= 2
        finally:
            browser.close()
