"""The app in a real browser: `streamlit run` in a subprocess, driven by Playwright with Debian's Chromium.

Each test starts the app headless on a free localhost port, waits on conditions (never fixed sleeps) and
stops the server itself. At 1400 x 1000 (a laptop window): the grid, the ranking table, the sidebar's
select boxes, the download buttons and the split tables are not cut; a hostile capture (Markdown in a
site name, script-breaking tokens) fetches nothing and is shown as text, also in bertviz's sandboxed
frame; the app's temporary folders are gone when the server stops. Nothing is downloaded: Playwright
drives /usr/bin/chromium (``make chromium``), never a browser of its own.
"""

from __future__ import annotations

import re

from helpers.browser import (
    MARKS,
    ROOT,
    VIEWPORT,
    WAIT_MS,
    box_of,
    chromium,
    goto,
    inside,
    serve,
)

pytestmark = MARKS


def test_app_in_chromium(legal_capture, tmp_path):
    from playwright.sync_api import expect

    with serve(tmp_path, str(legal_capture)) as url, chromium() as page:
        expect.set_options(timeout=WAIT_MS)
        page.goto(url)
        expect(page.get_by_text("Ranking: focused heads first")).to_be_visible()
        header = page.locator("h4").first
        expect(header).to_contain_text("head 0")
        window = {"x": 0, "y": 0, **VIEWPORT}

        # the whole layer x head grid is in the window: its last head column too
        grid = page.locator('[data-testid="stVegaLiteChart"]').first
        last = grid.locator('path[aria-label^="head: 11; layer: 5;"]').last
        expect(last).to_be_attached()
        assert inside(box_of(last), box_of(grid)) and inside(box_of(last), window)
        # the ranking table shows its label and the metric it is sorted by
        # (its header is drawn on a canvas: the table box is in the window and those columns come first)
        table = page.locator('[data-testid="stDataFrame"]').first
        expect(table).to_be_visible()
        assert inside(box_of(table), window)
        # the sidebar's select boxes are inside the sidebar
        sidebar = page.get_by_test_id("stSidebar")
        for box in sidebar.get_by_test_id("stSelectbox").all():
            assert inside(box_of(box), box_of(sidebar))
        expect(sidebar.get_by_text("encoder.layer.0.attention.self", exact=True)).to_be_visible()

        # choose a head by clicking its cell in the layer x head grid: layer 5, head 9
        grid.locator('path[aria-label^="head: 9; layer: 5;"]').last.click()
        expect(header).to_contain_text("encoder.layer.5.attention.self")
        expect(header).to_contain_text("head 9")

        # the Head view: the heatmap of that head, drawn by Vega, on a fixed 0..1 legend
        goto(page, "Head")
        heatmap = page.locator('[data-testid="stVegaLiteChart"]').filter(has_text="weights of query rows over keys")
        expect(heatmap).to_be_visible()
        expect(heatmap.locator("path[aria-roledescription='rect mark']").first).to_be_attached()
        assert heatmap.locator("path[aria-roledescription='rect mark']").count() >= 31 * 31
        expect(heatmap.get_by_text("1.00", exact=True)).to_be_attached()
        assert box_of(heatmap)["height"] < 900
        # a click on a cell chooses its query: the page's fragment asks for a whole-app rerun, so the sidebar
        # and the header follow; the colour scale reruns the page's fragment only and redraws the legend
        heatmap.locator("path[aria-label*='; query: 7 · ']").first.click()
        expect(header).to_contain_text("query 7")
        sidebar = page.get_by_test_id("stSidebar")
        position = sidebar.get_by_role("spinbutton", name="Query position")
        expect(position).to_have_value("7")
        # the position box: a typed position and Enter; its + button steps to the next query
        position.fill("12")
        position.press("Enter")
        expect(header).to_contain_text("query 12")
        sidebar.get_by_test_id("stNumberInputStepUp").first.click()
        expect(header).to_contain_text("query 13")
        expect(position).to_have_value("13")
        # the token search: part of a token, Enter picks the first match; the position box follows
        sidebar.get_by_role("combobox", name="Find a query token").click()
        page.keyboard.type("(indemnity)")  # the word a piece belongs to: the first piece of "indemnity" is chosen
        page.keyboard.press("Enter")
        expect(header).to_contain_text(re.compile(r"query \d+ «ind»"))
        expect(position).not_to_have_value("13")
        position.fill("7")
        position.press("Enter")
        expect(header).to_contain_text("query 7")
        page.get_by_test_id("stButtonGroup").filter(has_text="per row").get_by_text("log", exact=True).click()
        expect(heatmap.get_by_text("\u22124.00", exact=True)).to_be_attached()  # Vega's minus sign
        expect(header).to_contain_text("query 7")

        # Step by step: both download buttons in the window
        goto(page, "Step by step")
        for label in ("Download CSV", "Download JSON"):
            button = page.get_by_role("button", name=label, exact=True)
            expect(button).to_be_visible()
            assert inside(box_of(button), window)

        # the split finder on the legal example: one flagged head, layer 5 head 9; the sidebar follows it
        goto(page, "Split finder")
        page.get_by_role("textbox", name="Query word").fill("indemnity")
        page.get_by_role("textbox", name="Referents (comma-separated)").fill("Lessee,Lessor")
        page.get_by_role("button", name="Find split heads").click()
        expect(page.get_by_text("1 head flagged")).to_be_visible()
        flagged = page.locator('[data-testid="stTable"]').first
        expect(flagged).to_contain_text("encoder.layer.5.attention.self")
        expect(flagged.locator("tbody tr")).to_have_count(1)
        cells = flagged.locator("tbody tr td")  # site, layer, head, weights ...
        expect(cells.nth(1)).to_have_text("5")
        expect(cells.nth(2)).to_have_text("9")
        for i in range(cells.count()):  # the weights are not cut
            assert inside(box_of(cells.nth(i)), window)
        expect(header).to_contain_text("query 25")
        expect(page.locator(".shade")).to_be_visible()
        everything = page.locator('[data-testid="stDataFrame"]').first
        expect(everything).to_be_visible()
        assert inside(box_of(everything), window)

        shot = tmp_path / "app.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 20_000


def test_hostile_capture_fetches_nothing(tmp_path):
    from playwright.sync_api import expect

    import hostile

    path = hostile.hostile(tmp_path / "hostile.safetensors")
    with serve(tmp_path, str(path)) as url, chromium() as page:
        expect.set_options(timeout=WAIT_MS)
        requests: list[str] = []
        page.on("request", lambda r: requests.append(r.url))
        page.goto(url)
        header = page.locator("h4").first
        expect(header).to_contain_text(hostile.SITE)  # the site name as text, backtick and all
        expect(header).to_contain_text("`my`")
        expect(page.get_by_test_id("stSidebar")).to_contain_text(hostile.MODEL)
        for name in ("Head", "Step by step", "Split finder"):
            goto(page, name)
            expect(page.locator("h4").first).to_contain_text(hostile.SITE)
        if (ROOT / "apps" / "vendor" / "node_modules" / "d3").is_dir():
            goto(page, "bertviz")
            outer = page.locator('[data-testid="stIFrame"]')
            expect(outer).to_be_visible()
            inner = page.frame_locator('[data-testid="stIFrame"]').frame_locator('iframe[sandbox="allow-scripts"]')
            # bertviz drew the tokens: the script did not end at "</script>" nor stall at "<!--<script>"
            expect(inner.get_by_text("<!--<script>", exact=True).first).to_be_attached()
            expect(inner.get_by_text("</script>", exact=True).first).to_be_attached()
        assert not [u for u in requests if "127.0.0.1:9/" in u], requests
        assert all(u.startswith(url) or u.startswith("data:") or u == "about:srcdoc" for u in requests), \
            [u for u in requests if not u.startswith(url)]


def test_temporary_folders_removed_when_the_server_stops(tmp_path):
    from playwright.sync_api import expect

    fixture = ROOT / "fixtures" / "worked_example.safetensors"
    with serve(tmp_path) as url, chromium() as page:
        expect.set_options(timeout=WAIT_MS)
        page.goto(url)
        page.get_by_role("tab", name="Upload").click()  # the expander is open while no capture is
        page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(fixture))
        expect(page.get_by_test_id("stSidebar")).to_contain_text("upload worked_example.safetensors")
        folders = list((tmp_path / "tmp").glob("inspector-app-*"))
        assert folders and any(f.iterdir() for f in folders)
    assert not list((tmp_path / "tmp").glob("inspector-app-*"))
