"""Sources page: which source sentences the open capture's output (or a span of it) came from -- ContextCite's
random ablations and sparse linear surrogate (Cohen-Wang et al. 2024), its LDS and top-k drops beside
integrated gradients and attention, run on the capture's own model (:func:`inspector.attribute.sources.sources`).
Self-contained: it reads the open capture's texts and model name and nothing else of the app's state."""

from __future__ import annotations

import shared
import streamlit as st
from shared import ss

from inspector.attribute.sources import MODES, SourcesOptions, sources
from inspector.attribute.surrogate import ABLATIONS, ABLATIONS_RANGE, FOLDS
from inspector.errors import InspectorError
from inspector.investigate.matter import said_output
from inspector.ui import sources_view, views

c = shared.current()
key = shared.capture_key()
cap = c.cap
if "target" not in cap.roles():
    st.info("This capture has no output (an encoder, or a prompt alone): source attribution explains an output's "
            "log-probability. Capture a decoder-only or encoder-decoder model with --output (what it said) or --generate.")
    st.stop()
model_name = cap.meta.get("model", {}).get("name", "")
source = cap.records("source").text
output = cap.records("target").text
st.caption(views.md_text(f"Output: {output}"))
lo, hi = ABLATIONS_RANGE
with st.form("sources_form"):
    a, b, m = st.columns([3, 1, 1])
    span = a.text_input("Span of the output (empty: all of it)", key="sources_span",
                        help="A word or sentence the output says (first whole-word occurrence): its tokens' summed "
                             "log-probability is what the source sentences are ranked by.")
    n = b.number_input("Ablations", lo, hi, ABLATIONS, 8, key="sources_n",
                       help="Random masks (each sentence kept with probability 1/2) the surrogate is fitted on; "
                            f"the LDS is cross-validated over them ({FOLDS} folds).")
    mode = m.selectbox("Ablation", MODES, key="sources_mode",
                       help="mask: the sentence's tokens get attention mask 0 (positions kept); removal: they are "
                            "dropped from the source.")
    run = st.form_submit_button("Rank the source sentences")
done = ss.get("sources_result")
wanted = (key, span.strip(), int(n), mode)
if run:
    try:
        lm = shared.get_model(model_name)
        out = said_output(lm.model, lm.tokenizer, cap, source)
        glob = cap.meta.get("options", {}).get("global")
        with st.spinner(f"{int(n)} ablations of {views.md_text(model_name)}, batched …"):
            result = sources(lm.model, lm.tokenizer, source, out, span=span.strip() or None, global_tokens=glob,
                             options=SourcesOptions(ablations=int(n), mode=mode))
        ss.sources_result = done = (wanted, result)
    except InspectorError as exc:
        shared.show_error(views.app_error(exc))
        st.stop()
    except Exception as exc:  # a model that is not on this machine, or cannot run
        shared.show_error(f"source attribution needs the capture's model ({views.app_error(exc)}): open the capture "
                          "where its model is")
        st.stop()
if done is None or done[0][0] != key:
    st.caption("Press the button: it runs the capture's model on batches of ablated sources (a few forward passes).")
    st.stop()
result = done[1]
if done[0] != wanted:
    st.caption("The result below is for the previous settings: press the button to run these.")
method = st.radio("Shade and chart by", [m for m in result.methods["method"]], horizontal=True, key="sources_method",
                  format_func=lambda m: sources_view.LABELS.get(m, m))
st.html(sources_view.render_sources_section(result, method=method))
try:
    st.altair_chart(sources_view.chart(result, method=method), width="stretch")
except ImportError:
    st.caption("(the chart needs Altair: pip install inspector[plots])")
st.download_button("units.csv", views.csv_bytes(result.table), file_name="units.csv", mime="text/csv")
