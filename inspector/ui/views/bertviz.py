"""bertviz in the app: its head and model views of a token window from the captured weights, made to draw offline
(require.js, d3 and jQuery inlined from ``make assets``), with tokens escaped for its inline script and the page
sandboxed in an iframe."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from inspector.errors import InspectorError
from inspector.store.capture_file import Capture, Site
from inspector.ui.views.labels import groups
from inspector.ui.views.shading import templates

BERTVIZ_MAX_TOKENS = 64  # bertviz embeds every weight as JSON: a 64-token window of 12 x 12 heads is ~4 MB
# bertviz's model view draws one SVG line per weight of every head (layers x heads x window^2): 6 x 12 heads
# at 64 tokens are 295k lines, about 10 s in Chromium before anything shows; at 32 tokens 74k lines, 2.6 s
MODEL_VIEW_MAX_TOKENS = 32
# ... and a window's weights are layers x heads x window^2 over the stacks bertviz draws: a capture of 4,000 heads
# at one layer kept Chromium busy 13 s for a 4-token window, 20,000 heads 50 s. These bound what one page embeds
# (the head view, about 6 bytes of JSON a weight: 2.5 M is 15 MB, a 64-token window of BART-large's three stacks)
# and draws (the model view: one line a weight), and the heads a layer may have (its colour boxes and thumbnails;
# the largest text models have 128).
BERTVIZ_MAX_WEIGHTS = 2_500_000
MODEL_VIEW_MAX_WEIGHTS = 300_000
BERTVIZ_MAX_HEADS = 128


VENDOR_FILES = {  # what bertviz's HTML would fetch from cdnjs, as installed by `make assets`
    "requirejs": "requirejs/require.js",
    "d3": "d3/dist/d3.min.js",
    "jquery": "jquery/dist/jquery.min.js",
}


def _drawn(capture: Capture) -> list[tuple[list[Site], str]]:
    """The sites bertviz draws, one per layer, by stack (encoder, decoder, cross; or the single stack's self sites
    of its first site's shape), each with the axis its window's keys are on (``key`` for cross, else ``query``)."""
    def per_layer(sites: list[Site]) -> list[Site]:
        first: dict[int, Site] = {}
        for s in sites:
            first.setdefault(s.layer, s)
        return [s for _, s in sorted(first.items())]

    by_group = {(stack, kind): sites for stack, kind, sites in groups(capture)}
    enc = by_group.get(("encoder", "self"))
    if enc:
        dec = by_group.get(("decoder", "causal")) or by_group.get(("decoder", "self"))
        cross = by_group.get(("decoder", "cross")) if dec else None
        return [(per_layer(g), "key" if g is cross else "query") for g in (enc, dec, cross) if g]
    sites = [s for _, kind, ss in groups(capture) if kind != "cross" for s in ss]
    same = [s for s in sites if sites and (s.query_len, s.key_len) == (sites[0].query_len, sites[0].key_len)]
    return [(per_layer(same), "query")] if same else []


def bertviz_weights(capture: Capture, size: int) -> int:
    """How many weights bertviz embeds (head view) or draws as lines (model view) for a window of ``size`` tokens
    of ``capture``: heads x query window x key window, summed over the layers and stacks it draws. From the header
    alone."""
    return sum(s.num_heads * min(size, s.query_len) * min(size, s.key_len if axis == "key" else s.query_len)
               for sites, axis in _drawn(capture) for s in sites)


def check_bertviz(capture: Capture, view: str, size: int) -> None:
    """Refuse, in one line naming the fix, a window bertviz would take too long to draw: a layer with more than
    :data:`BERTVIZ_MAX_HEADS` heads, or more than :data:`BERTVIZ_MAX_WEIGHTS` weights
    (:data:`MODEL_VIEW_MAX_WEIGHTS` in the model view; :func:`bertviz_weights`). Raises :class:`InspectorError`."""
    heads = max((s.num_heads for sites, _ in _drawn(capture) for s in sites), default=0)
    if heads > BERTVIZ_MAX_HEADS:
        raise InspectorError(f"this capture has {heads:,} heads in a layer, more than bertviz draws ({BERTVIZ_MAX_HEADS}): "
                             "use the Head view, which shows one head at a time")
    bound = MODEL_VIEW_MAX_WEIGHTS if view == "model" else BERTVIZ_MAX_WEIGHTS
    n = bertviz_weights(capture, size)
    if n > bound:
        raise InspectorError(f"bertviz's {view} view of a {size}-token window of this capture holds {n:,} weights, more "
                             f"than it draws ({bound:,}): choose a smaller window, or use the Head view")


def bertviz_kwargs(capture: Capture, start: int, size: int, *, batch: int = 0, decimals: int = 3) -> dict:
    """Keyword arguments for ``bertviz.head_view`` / ``model_view`` from the captured weights of a
    token window ``[start, start + size)`` (applied to each axis, clipped to its length).

    Single-stack models give ``attention`` and ``tokens``; encoder-decoder models the encoder,
    decoder and cross attentions and both token lists. Weights are rounded to ``decimals`` places,
    which keeps bertviz's JSON about three times smaller; rows are not renormalized, so weight on
    keys outside the window is simply not drawn.
    """
    if size > BERTVIZ_MAX_TOKENS:
        raise InspectorError(f"bertviz windows hold at most {BERTVIZ_MAX_TOKENS} tokens; got {size}: choose a smaller window")
    by_group = {(stack, kind): sites for stack, kind, sites in groups(capture)}

    def stack_of(sites: list[Site], q_axis: slice, k_axis: slice) -> list[torch.Tensor]:
        per_layer: dict[int, Site] = {}
        for s in sites:
            per_layer.setdefault(s.layer, s)
        out = []
        for _, s in sorted(per_layer.items()):
            w = capture.weights(s, batch, queries=q_axis)[:, :, k_axis]
            out.append(torch.round(w.double(), decimals=decimals).unsqueeze(0))  # float64: JSON "0.123", not 0.12300000339
        return out

    def toks(site: Site, which: str, ax: slice) -> list[str]:
        # tokens go to bertviz as they are; bertviz_html escapes them for its inline script (script_safe_json)
        return list(capture.tokens(site, which, batch)[ax])

    def win(site: Site, which: str) -> slice:
        n = site.query_len if which == "query" else site.key_len
        a = min(max(0, start), max(0, n - 1))
        return slice(a, min(n, a + size))

    enc = by_group.get(("encoder", "self"))
    if enc:
        dec = by_group.get(("decoder", "causal")) or by_group.get(("decoder", "self"))
        cross = by_group.get(("decoder", "cross"))
        e_ax = win(enc[0], "query")
        kwargs: dict = {
            "encoder_attention": stack_of(enc, e_ax, e_ax),
            "encoder_tokens": toks(enc[0], "query", e_ax),
        }
        if dec:
            d_ax = win(dec[0], "query")
            kwargs["decoder_attention"] = stack_of(dec, d_ax, d_ax)
            kwargs["decoder_tokens"] = toks(dec[0], "query", d_ax)
            if cross:
                kwargs["cross_attention"] = stack_of(cross, d_ax, win(cross[0], "key"))
        return kwargs
    # single stack: the self / causal sites (cross sites of a single-stack model have no square matrix)
    sites = [s for stack, kind, ss in groups(capture) if kind != "cross" for s in ss]
    if not sites:
        raise InspectorError("this capture has no self-attention sites for bertviz to draw")
    ax = win(sites[0], "query")
    same_len = [s for s in sites if s.query_len == sites[0].query_len and s.key_len == sites[0].key_len]
    return {"attention": stack_of(same_len, ax, ax), "tokens": toks(sites[0], "query", ax)}


def default_vendor_dir() -> Path:
    """Where ``make assets`` puts bertviz's scripts: ``$INSPECTOR_VENDOR``, else ``apps/vendor/node_modules``
    of the checkout this package runs from (what the app serves)."""
    import os

    given = os.environ.get("INSPECTOR_VENDOR")
    return Path(given) if given else Path(__file__).resolve().parents[3] / "apps" / "vendor" / "node_modules"


def vendor_scripts(vendor_dir: str | Path) -> dict[str, str]:
    """The three scripts bertviz needs, read from ``apps/vendor/node_modules`` (``make assets``)."""
    root = Path(vendor_dir)
    out = {}
    for name, rel in VENDOR_FILES.items():
        path = root / rel
        if not path.is_file():
            raise InspectorError(
                f"bertviz needs {name} at {path}, which is missing: run `make assets` "
                "(npm install --prefix apps/vendor) and reload the app"
            )
        out[name] = path.read_text(encoding="utf-8").replace("</script", "<\\/script")
    return out


# bertviz's model view draws at a fixed width (970 px): in a narrower frame or notebook cell its last heads were
# cut off. Each bertviz SVG drawn at a fixed size in pixels gets a viewBox from that width and height, so CSS
# scales it down to fit. An SVG whose width or height is relative (the head view's width="100%") already follows
# its container and keeps its own coordinates: read as a viewBox, "100%" made 100 units fill the frame and drew
# the head view ~9x too large (tokens 100+ px tall, most heads outside the frame).
FIT_WIDTH = (
    '<style>[id^="bertviz-"] svg[viewBox]{max-width:100%;height:auto}</style>\n'
    "<script>(function () {"
    "var px = /^\\s*[0-9.]+\\s*(px)?\\s*$/;"
    "function fit() { document.querySelectorAll('[id^=\"bertviz-\"] svg:not([viewBox])').forEach(function (s) {"
    "var w = s.getAttribute('width'), h = s.getAttribute('height');"
    "if (px.test(w || '') && px.test(h || '')) {"
    " s.setAttribute('viewBox', '0 0 ' + parseFloat(w) + ' ' + parseFloat(h)); } }); }"
    "new MutationObserver(fit).observe(document.documentElement, {childList: true, subtree: true});"
    "})();</script>\n"
)
_CDN_SCRIPT = re.compile(r'<script\s+src="https://[^"]*require[^"]*"\s*>\s*</script>', re.IGNORECASE)
_REQUIRE_CONFIG = re.compile(r"require\.config\(\{\s*paths:\s*\{[^}]*\}\s*\}\);", re.DOTALL)


def offline_bertviz(page: str, scripts: dict[str, str]) -> str:
    """bertviz's returned HTML with require.js, d3 and jQuery inlined and its CDN URLs removed, and its
    drawing scaled to the width it is shown in (:data:`FIT_WIDTH`).

    require.js replaces the CDN ``<script src>``; d3 and jQuery run as plain scripts (with ``define``
    hidden, so they set globals instead of registering anonymous modules) and are then registered
    under the names bertviz asks for; the ``require.config`` that pointed those names at cdnjs is
    dropped. The result fetches nothing.
    """
    if not _CDN_SCRIPT.search(page) or not _REQUIRE_CONFIG.search(page):
        raise InspectorError("this bertviz version's HTML has an unexpected layout: the app cannot serve its scripts offline")
    head = templates().get_template("bertviz_scripts.html.j2").render(scripts=scripts)
    page = _CDN_SCRIPT.sub(lambda _: head + FIT_WIDTH, page, count=1)
    page = _REQUIRE_CONFIG.sub("/* d3 and jquery are defined inline above */", page)
    if re.search(r"https?://cdn", page):
        raise InspectorError("bertviz's HTML still names a CDN after rewriting: the app cannot show it offline")
    return page


def bertviz_html(capture: Capture, view: str, start: int, size: int, *, vendor_dir: str | Path, batch: int = 0,
                 layer: int | None = None, heads: list[int] | None = None) -> str:
    """bertviz's head or model view of a token window, as self-contained HTML. For the head view,
    ``layer`` (an index into the captured layers) and ``heads`` pick what is shown first. The model view
    takes windows of at most :data:`MODEL_VIEW_MAX_TOKENS` tokens, and either view a window within
    :func:`check_bertviz`'s bounds (:class:`InspectorError` otherwise)."""
    import bertviz

    if view == "model" and size > MODEL_VIEW_MAX_TOKENS:
        raise InspectorError(f"bertviz's model view draws every weight of every head: windows of at most "
                             f"{MODEL_VIEW_MAX_TOKENS} tokens, got {size}: choose a smaller window (or the head view)")

    check_bertviz(capture, view, size)
    scripts = vendor_scripts(vendor_dir)
    kwargs = bertviz_kwargs(capture, start, size, batch=batch)
    if view == "head":
        page = bertviz.head_view(**kwargs, layer=layer, heads=heads, html_action="return").data
    elif view == "model":
        page = bertviz.model_view(**kwargs, html_action="return").data
    else:
        raise InspectorError(f"unknown bertviz view {view!r}: use head or model")
    template = (Path(bertviz.__file__).parent / f"{view}_view.js").read_text(encoding="utf-8")
    return offline_bertviz(script_safe_json(page, template), scripts)


def html_size(page: str) -> str:
    """The UTF-8 size of ``page`` for a label: kB below 100 kB, else MB."""
    n = len(page.encode("utf-8"))
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.0f} kB"


def script_safe_json(page: str, template: str) -> str:
    """bertviz's page with ``<``, ``>`` and ``&`` escaped (``\\u003c`` ...) inside the JSON it pasted into
    its inline script in place of ``PYTHON_PARAMS`` in ``template`` (head_view.js / model_view.js).

    A token ``</script>`` or ``<!--<script>`` would otherwise end or suspend the inline script and blank
    the view; JSON has no ``<`` outside strings, and ``\\u003c`` reads back as the same character."""
    before, marker, after = template.partition("PYTHON_PARAMS")
    if not marker:
        raise InspectorError("this bertviz version's script has no PYTHON_PARAMS marker: the app cannot escape its tokens")
    head = before[-200:]
    start = page.find(head)
    if start < 0:
        raise InspectorError("bertviz's page does not contain its own script: the app cannot escape its tokens")
    start += len(head)
    try:
        _, end = json.JSONDecoder().raw_decode(page, start)  # the exact end of the pasted JSON
    except ValueError:
        raise InspectorError("bertviz's page holds no JSON where its script expects it: the app cannot escape its tokens") from None
    blob = page[start:end]
    safe = blob.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return page.replace(blob, safe)  # bertviz pastes it twice: also into a comment of the same script


def sandboxed(page: str, height: int) -> str:
    """``page`` inside an ``<iframe sandbox="allow-scripts">``: its scripts run in an opaque origin,
    with no access to the app's page, cookies or Streamlit's connection."""
    return templates().get_template("sandboxed.html.j2").render(page=page, height=int(height))
