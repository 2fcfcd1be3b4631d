"""bertviz page: bertviz's head and model views of a token window, sandboxed and offline."""

from __future__ import annotations

import shared
import streamlit as st
from shared import PERSIST, VENDOR, ss

from inspector.errors import InspectorError
from inspector.ui import views

c = shared.current()
cap, site, head = c.cap, c.site, c.head
longest = max(max(s.query_len, s.key_len) for s in cap.sites)
limit = views.BERTVIZ_MAX_TOKENS
st.caption(
    f"bertviz draws the captured weights of every layer and head. It embeds every weight in the page as JSON "
    f"(about 52 MB at 128 tokens for 6 × 12 heads), so the app offers it for windows of at most {limit} tokens "
    f"({views.MODEL_VIEW_MAX_TOKENS} in the model view, which draws one line per weight of every head); "
    "rows are not renormalized, so weight on tokens outside the window is not drawn. "
    "Its scripts (require.js, d3, jQuery) are served from apps/vendor, never from a CDN, and run in a sandboxed frame."
)
c1, c2, c3 = st.columns([1.2, 1, 1.5])
c1.radio("View", ["head view", "model view"], key="bv_view", horizontal=True, persist_state=PERSIST)
view = ss.bv_view.split()[0]
if view == "model":
    limit = views.MODEL_VIEW_MAX_TOKENS
try:  # the smallest window first: a capture with too many heads or layers has none bertviz can draw in time
    views.check_bertviz(cap, view, min(longest, 8))
except InspectorError as exc:
    shared.show_error(views.app_error(exc))
    st.stop()
bound = views.MODEL_VIEW_MAX_WEIGHTS if view == "model" else views.BERTVIZ_MAX_WEIGHTS
if longest > limit or views.bertviz_weights(cap, longest) > bound:
    sizes = [n for n in (8, 16, 24, 32, 48, 64) if n <= limit and views.bertviz_weights(cap, n) <= bound] or [8]
    if ss.get("bv_size") not in sizes:
        ss.bv_size = max(n for n in sizes if n <= limit)
    c2.number_input(f"First token (0..{longest - 1})", 0, longest - 1, key="bv_start", persist_state=PERSIST)
    c3.select_slider("Window (tokens)", sizes, key="bv_size", persist_state=PERSIST)
    start, size = int(ss.bv_start), int(ss.bv_size)
else:
    start, size = 0, longest
    c2.caption(f"All {longest} tokens fit in one window.")
layers = sorted({s.layer for s in cap.sites if (s.stack, s.kind) == (site.stack, site.kind)})
layer_index = layers.index(site.layer) if site.layer in layers else 0
cache_key = (ss.path, ss.bv_view, start, size, layer_index, head)
if ss.bertviz_page is None or ss.bertviz_page[0] != cache_key:
    try:
        with st.spinner("Rendering bertviz …"):
            page = views.bertviz_html(cap, view, start, size, vendor_dir=VENDOR, layer=layer_index, heads=[head])
    except InspectorError as exc:
        shared.show_error(views.app_error(exc))
        st.stop()
    except Exception as exc:  # bertviz rejects some layouts (e.g. unequal layer counts)
        shared.show_error(f"bertviz cannot draw this capture ({views.app_error(exc)}): use the Head view, which shows any site")
        st.stop()
    ss.bertviz_page = (cache_key, page)
page = ss.bertviz_page[1]
st.caption(f"Tokens {start}..{start + size - 1} · page size {views.html_size(page)} · raw attention weights "
           "(bertviz draws the captured weights; the sidebar's switch applies to the other pages)")
height = 900 if ss.bv_view == "model view" else 40 + 22 * min(size, longest) + 120
st.iframe(views.sandboxed(page, height), height=height + 12)
