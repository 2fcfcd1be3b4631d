"""The sweep: every text model family of the installed transformers that builds tiny from its config
(tests/families.py) is captured exactly, or through a weights-only site that matches, or refused with
one line that names the module. For each family, in a full and a lazy capture and on a padded batch
of two:

* every attention map the model returns with ``output_attentions`` (eager) equals a captured site's
  weights within 1e-5 -- none is dropped;
* weights recomputed from the stored Q, K and mask equal the stored ones; lazy captures recompute them;
* the model's outputs are unchanged by the capture;
* the site's kind agrees with the weights: ``causal`` hides every later key, ``self`` shows one;
* the file it writes is one that ``load`` reads.

The sweep runs once (a module fixture) and reports by outcome class, not one pytest test or skip per
family: one test that no family fails a check (printing the counts with ``-s``), and one test per class
(captured; refused by name, with why; not a text model; not buildable tiny) asserting that it holds the
families pinned in ``fixtures/families.json`` for the installed transformers. So a real skip stays
visible in ``make test``. ``INSPECTOR_WRITE_FAMILIES=1`` rewrites the pinned file from a run.
"""

from __future__ import annotations

import collections
import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from inspector.capture import attn_implementation, capture, probability_maps
from inspector.capture.inputs import encode
from inspector.errors import InspectorError
from inspector.store import attention, load

import families

TOL = 1e-5
TEXT = "The Lessee shall indemnify the Lessor. Such indemnity survives."
SHORT = "Such indemnity survives."
TARGET = "The Lessor shall pay."
EXPECTED = Path(__file__).resolve().parents[1] / "fixtures" / "families.json"  # family -> outcome class, pinned


def _main_output(out) -> torch.Tensor:
    for name in ("logits", "last_hidden_state", "prediction_logits"):
        t = getattr(out, name, None)
        if isinstance(t, torch.Tensor):
            return t
    return next(v for v in out.values() if isinstance(v, torch.Tensor) and v.is_floating_point())


def _maps(value) -> list[torch.Tensor]:
    """Every tensor under an output's attention fields, nested tuples flattened."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _maps(v)]
    return []


def _reference(model, kwargs):
    with torch.no_grad():
        plain = model(**kwargs, use_cache=False) if _takes_cache(model) else model(**kwargs)
        with attn_implementation(model, "eager"):
            eager = model(**kwargs, output_attentions=True, **({"use_cache": False} if _takes_cache(model) else {}))
    maps = []
    batch = int(kwargs["input_ids"].shape[0])
    for key, value in eager.items():
        if "attentions" in key:  # what the model returns there; only probability maps are attention weights
            maps += [t for t in _maps(value) if probability_maps(t, batch) and not _window_form(model, t, kwargs)]
    return _main_output(plain), maps


def _window_form(model, t, kwargs) -> bool:
    """A banded module's window-and-globals map (LED, Longformer): captured mapped to tokens, and checked
    against the model's own attention in tests/test_long_attention.py."""
    from inspector.capture import banded

    lengths = {int(v.shape[1]) for k, v in kwargs.items() if k.endswith("input_ids")}
    return t.shape[-1] not in lengths and any(banded.is_banded(m) for m in model.modules())


def _takes_cache(model) -> bool:
    import inspect

    return "use_cache" in inspect.signature(model.forward).parameters


def _real(out: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Output rows of real (non-padding) tokens."""
    return out[mask.bool()] if out.dim() >= 2 and out.shape[:2] == mask.shape else out


class NeedsMoreThanTokenIds(Exception):
    """The family's own forward fails on token ids alone (it needs boxes, images, a language id ...)."""


def _check_capture(model, tok, text, target, tmp_path, label):
    enc = encode(model, tok, text, target)
    try:  # the family's own forward first, before inspector touches the model
        ref_out, ref_maps = _reference(model, enc.model_kwargs)
    except Exception as exc:
        raise NeedsMoreThanTokenIds(type(exc).__name__) from exc
    full = capture(model, tok, text, target)
    lazy = capture(model, tok, text, target, weights=False)
    real = enc.model_kwargs.get("decoder_attention_mask", enc.model_kwargs["attention_mask"])
    for cap in (full, lazy):
        got = _main_output(cap.output)
        torch.testing.assert_close(_real(got, real), _real(ref_out, real), atol=TOL, rtol=TOL,
                                   msg=lambda m: f"{label}: outputs changed by the capture: {m}")
        load(cap.save(tmp_path / f"{label}.safetensors"))  # never a file load refuses
    stored = {s.name: full.tensor(s, "weights") for s in full.sites if "weights" in s.parts}
    for i, ref in enumerate(ref_maps):  # every map the model returns is a captured site's weights
        same = [n for n, w in stored.items() if w.shape == ref.shape and torch.allclose(w, ref, atol=TOL, rtol=0)]
        assert same, f"{label}: output_attentions map {i} {tuple(ref.shape)} matches no captured site (dropped)"
    for site in full.sites:
        w = stored[site.name]
        if {"q", "k"} <= set(site.parts) and site.recomputable:
            q, k = full.tensor(site, "q").float(), attention.expand_kv(full.tensor(site, "k").float(), site.head_map)
            mask = full.tensor(site, "mask").float() if site.mask else None
            again = attention.attention_weights(q, k, scaling=site.scaling, mask=mask, softcap=site.softcap)
            torch.testing.assert_close(again, w, atol=TOL, rtol=0, msg=lambda m, s=site: f"{label}: {s.name} recompute: {m}")
            for b in range(full.batch_size):
                torch.testing.assert_close(lazy.weights(site.name, batch=b), w[b], atol=TOL, rtol=0,
                                           msg=lambda m, s=site: f"{label}: {s.name} lazy: {m}")
        _check_kind(full, site, w, label)
    return full


def _check_kind(cap, site, w, label):
    if site.kind == "cross":
        assert site.query_input != site.key_input or site.query_input == [], f"{label}: {site.name} cross over one input"
        return
    if site.query_len != site.key_len or site.query_len < 2:
        return
    _, pad = cap.flags(site, "key", 0)
    rows = w[0][:, ~pad][:, :, ~pad]
    later = torch.triu(torch.ones(rows.shape[-2:], dtype=torch.bool), diagonal=1)
    sees_later = bool((rows[..., later] > 0).any())
    assert sees_later == (site.kind == "self"), f"{label}: {site.name} is {site.kind} but later keys get weight {sees_later}"


def _one_line_naming_a_module(message: str, model) -> bool:
    names = {type(m).__name__ for m in model.modules()} | {n for n, _ in model.named_modules() if n}
    return "\n" not in message and any(n in message for n in names)


@pytest.fixture(scope="module")
def tok():
    import tiny

    return tiny.tokenizer()


@dataclass(frozen=True)
class Outcome:
    """One family's outcome: ``kind`` one of :data:`CLASSES` (or ``failed``), ``detail`` the sub-kind or reason."""

    kind: str
    detail: str


CLASSES = ("captured", "refused", "not a text model", "not buildable tiny")
NOT_BUILT = {"non-text": "not a text model"}  # every other reason build() gives: not buildable tiny


def _run_family(model_type: str, tok, tmp_path) -> Outcome:
    model, why = families.build(model_type)
    families.build.cache_clear()  # one tiny model alive at a time
    if model is None:
        return Outcome(NOT_BUILT.get(why, "not buildable tiny"), why)
    target = TARGET if getattr(model.config, "is_encoder_decoder", False) else None
    try:  # one padded batch of two: the first row unpadded, the second padded
        cap = _check_capture(model, tok, [TEXT, SHORT], [target, SHORT] if target else None, tmp_path, "padded")
    except NeedsMoreThanTokenIds as exc:
        return Outcome("not a text model", f"needs more than token ids ({exc})")
    except InspectorError as exc:
        if not _one_line_naming_a_module(str(exc), model):
            return Outcome("failed", f"refusal does not name a module: {exc}")
        return Outcome("refused", str(exc))
    except Exception as exc:  # noqa: BLE001 - an assertion or a crash: the family fails, named with its message
        return Outcome("failed", f"{type(exc).__name__}: {str(exc)[:400]}")
    outcome = "weights-only" if any("q" not in s.parts for s in cap.sites) else "exact"  # taken from output_attentions
    if cap.meta.get("unrecorded"):  # modules named in the warning and the metadata, not captured
        outcome += " + named modules"
    return Outcome("captured", outcome)


@pytest.fixture(scope="module")
def sweep(tok, tmp_path_factory) -> dict[str, Outcome]:
    """Every family's outcome (the sweep runs once for the tests below); written to :data:`EXPECTED` when
    ``INSPECTOR_WRITE_FAMILIES=1``."""
    tmp = tmp_path_factory.mktemp("families")
    found = {t: _run_family(t, tok, tmp) for t in families.families()}
    if os.environ.get("INSPECTOR_WRITE_FAMILIES") == "1":
        import transformers

        classes = {t: o.kind for t, o in sorted(found.items()) if o.kind != "failed"}
        EXPECTED.write_text(json.dumps({"transformers": transformers.__version__, "outcomes": classes}, indent=0) + "\n")
    return found


def test_every_family_that_builds_is_captured_exactly_or_refused_by_name(sweep):
    """No family fails a check (module docstring); the counts per outcome are printed."""
    counts = collections.Counter(o.kind for o in sweep.values())
    details = collections.Counter(o.detail for o in sweep.values() if o.kind == "captured")
    with_reason = collections.Counter(o.detail.split(" (")[0] for o in sweep.values() if o.kind in ("not a text model", "not buildable tiny"))
    print(f"\nfamily sweep over {len(sweep)} model types: {dict(sorted(counts.items()))}")
    print(f"captured: {dict(sorted(details.items()))}; not swept: {dict(sorted(with_reason.items()))}")
    for what in ("weights-only", "exact + named modules", "weights-only + named modules"):
        print(f"{what}:", ", ".join(sorted(f for f, o in sweep.items() if o.detail == what)))
    for family, o in sorted(sweep.items()):
        if o.kind == "refused":
            print(f"refused {family}: {o.detail[:160]}")
    failed = {t: o.detail for t, o in sweep.items() if o.kind == "failed"}
    assert not failed, "\n".join(f"{t}: {m}" for t, m in sorted(failed.items()))


def _expected() -> dict[str, str]:
    import transformers

    pinned = json.loads(EXPECTED.read_text())
    if pinned["transformers"] != transformers.__version__:
        pytest.skip(f"the expected outcomes are pinned for transformers {pinned['transformers']}, not the installed "
                    f"{transformers.__version__}: rerun with INSPECTOR_WRITE_FAMILIES=1 and review the diff")
    return pinned["outcomes"]


@pytest.mark.parametrize("kind", CLASSES)
def test_outcome_class_holds_the_expected_families(sweep, kind):
    """Each class holds exactly the families pinned in fixtures/families.json: a family that moves (say from
    captured to refused, or out of the buildable ones) fails here by name."""
    want = {t for t, k in _expected().items() if k == kind}
    got = {t for t, o in sweep.items() if o.kind == kind}
    assert got == want, f"{kind}: now also {sorted(got - want)}; no longer {sorted(want - got)}"
