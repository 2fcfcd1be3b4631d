"""Altair charts of ``inspector.show`` emitted as HTML in every way a user can (issue 29): Altair's own
``chart.save("x.html")`` (``chart.to_html()`` writes the same page), the notebook's ``html`` renderer, and ``show.save``. Tokens and a
site name that try to end the inline script (``</script><script>...``), open a comment, or add an element with
an ``onerror`` handler are opened in Debian's Chromium (offline: Vega inlined, every request outside the page
refused): no script of theirs runs, nothing outside the chart appears, and the text reaches Vega as data (it
shows, as it is, in the SVG Vega draws)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from inspector.attribute.routes import EDGE_COLUMNS
from inspector.store import load
from inspector.ui import show

import hostile
from helpers.browser import MARKS, WAIT_MS, launch

PWN = "</script><script>window.__pwned='script'</script>"
TOKENS = [PWN, "<img src=x onerror=\"window.__pwned='img'\">", "<!--<script>", "a&amp;b%3C"]
SITE = "s</script><script>window.__pwned='title'</script>"
EMBED = {"renderer": "svg", "actions": False}

pytestmark = MARKS


@pytest.fixture(scope="module")
def cap(tmp_path_factory):
    def edit(meta, tensors):
        old = meta["sites"][0]["name"]
        meta["sites"][0]["name"] = SITE
        meta["sites"][0]["mask"] = f"{SITE}/mask"
        meta["inputs"][0]["tokens"] = TOKENS[: len(meta["inputs"][0]["tokens"])]
        return {k.replace(old, SITE): v for k, v in tensors.items()}

    return load(hostile.rewrite(tmp_path_factory.mktemp("html") / "h.safetensors", edit))


def route_edges() -> pd.DataFrame:
    """A two-edge route whose tokens and site name are the hostile ones."""
    rows = [{"stack": "none", "layer": 0, "sublayer": "attention", "from_stack": "none", "from_level": 0,
             "from_position": 0, "from_token": TOKENS[0], "to_level": 1, "to_position": 1, "to_token": TOKENS[1],
             "kind": "attention", "site": SITE, "head": h, "importance": 0.5} for h in (-1, 0)]
    return pd.DataFrame(rows, columns=EDGE_COLUMNS)


def charts(cap) -> dict:
    site = cap.sites[0]
    return {"heatmap": show.head_heatmap(cap, site, 0), "query": show.query_weights(cap, site, 0, 3),
            "grid": show.head_grid(cap), "routes": show.routes(route_edges())}


def pages(chart, folder: Path, name: str) -> dict[str, Path]:
    """The chart as every HTML a user can make of it, each a file in ``folder``."""
    import altair as alt

    out = {}
    saved = folder / f"{name}-save.html"
    chart.save(str(saved), inline=True, embed_options=EMBED)
    out["chart.save"] = saved
    with alt.renderers.enable("html", template="inline", embed_options=EMBED):
        bundle = chart._repr_mimebundle_()
    bundle = bundle[0] if isinstance(bundle, tuple) else bundle
    rendered = folder / f"{name}-renderer.html"
    rendered.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>{bundle['text/html']}"
                        "</body></html>", encoding="utf-8")
    out["html renderer"] = rendered
    out["show.save"] = show.save(chart, folder / f"{name}-show.html")
    return out


def test_every_html_of_every_chart_draws_hostile_text_as_data(cap, tmp_path, monkeypatch):
    import functools

    import vl_convert
    from playwright.sync_api import sync_playwright

    # the inlined Vega bundle is the same for every page: made once (vl-convert takes a second for each)
    monkeypatch.setattr(vl_convert, "javascript_bundle", functools.cache(vl_convert.javascript_bundle))

    outside: list[str] = []

    def gate(route):
        if route.request.url.startswith(("file://", "data:")):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    made = {(name, how): path for name, chart in charts(cap).items() for how, path in pages(chart, tmp_path, name).items()}
    for path in made.values():
        page = path.read_text(encoding="utf-8")
        for text in [*TOKENS[:3], SITE]:
            assert text not in page, (path.name, text)  # no markup of the text, anywhere in the page
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.route("**/*", gate)
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            for (name, how), path in made.items():
                page.goto(path.as_uri(), wait_until="load")
                # Vega has drawn the chart (svg renderer; show.save's page uses Altair's default canvas), or a
                # script of the text ran
                page.wait_for_function("() => window.__pwned !== undefined || "
                                       "document.querySelector('.vega-embed svg, .vega-embed canvas') !== null",
                                       timeout=WAIT_MS)
                assert page.evaluate("() => window.__pwned === undefined"), (name, how, page.evaluate("window.__pwned"))
                assert page.evaluate("() => document.querySelectorAll('img').length") == 0, (name, how)
                assert not errors, (name, how, errors)
                if how != "show.save":  # the text reached Vega as data: it is in what Vega drew, decoded
                    drawn = page.evaluate(
                        "() => Array.from(document.querySelectorAll('.vega-embed svg [aria-label], .vega-embed svg text'))"
                        ".map(e => (e.getAttribute('aria-label') || '') + ' ' + e.textContent).join('\\n')")
                    for text in [SITE] + (TOKENS[:2] if name != "grid" else []):
                        assert text in drawn, (name, how, text)
                    assert "%3C" not in drawn.replace("a&amp;b%3C", ""), (name, how)  # decoded before drawing
        finally:
            browser.close()
    assert outside == []


def test_the_decoding_is_exact(cap):
    """What Vega draws is the token itself: the chart's data decoded by its own transform equals the capture's
    text (checked in Vega itself, through vl-convert's SVG, for a token with every coded character)."""
    import re

    import vl_convert as vlc

    site = cap.sites[0]
    chart = show.query_weights(cap, site, 0, 3)
    svg = vlc.vegalite_to_svg(chart.to_json())
    labels = [m.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&amp;", "&")
              for m in re.findall(r'aria-label="([^"]*)"', svg)]
    assert any(f"key_token: {TOKENS[3]}" in label for label in labels), labels[:5]
    assert any(SITE in label for label in labels)
