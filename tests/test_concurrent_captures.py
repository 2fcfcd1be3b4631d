"""Captures of one model in several threads (the local scan's worker threads): ``concurrent_captures`` holds the
model pointed at the recording attention for the block, each thread records only its own calls, a step that changes
the model runs alone, and the scan's rows are those of one worker."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import pytest
import torch

from inspector.capture import interface
from inspector.capture.inputs import TOKENIZER_LOCK
from inspector.capture.recorder import capture
from inspector.corpus import reduce
from inspector.corpus.documents import Document
from inspector.corpus.engine import Engine
from inspector.corpus.leases import lease_rows
from inspector.corpus.scan import scan
from inspector.errors import InspectorError

import tiny
from helpers.longformer import longformer

TEXTS = ["The Lessee shall indemnify the Lessor.", "The Lessor shall repair the roof and the walls of the premises.",
         "Notice must be given in writing.", "The term is five years from the commencement date of this lease."]


class _Watched:
    """Counts the forward passes of ``model`` running at once. Each pass waits (up to ``wait`` seconds) at a
    barrier of two, so that two passes that may overlap do; a second, eager pass (``output_attentions=True``) notes
    whether another pass ran beside it."""

    def __init__(self, model, wait: float = 0.5):
        self.active = self.most = 0
        self.second_not_alone = False
        self._lock = threading.Lock()
        self._barrier = threading.Barrier(2)
        own = model.forward

        def forward(*a, **k):
            second = bool(k.get("output_attentions"))
            with self._lock:
                self.active += 1
                self.most = max(self.most, self.active)
            try:
                try:
                    self._barrier.wait(wait)
                except threading.BrokenBarrierError:
                    self._barrier.reset()
                with self._lock:
                    self.second_not_alone |= second and self.active > 1
                out = own(*a, **k)
                with self._lock:
                    self.second_not_alone |= second and self.active > 1
                return out
            finally:
                with self._lock:
                    self.active -= 1

        model.forward = forward


def _captures(model, tok, texts, threads: int, **options) -> list[dict[str, torch.Tensor]]:
    def one(text):
        return capture(model, tok, text, **options).tensors

    if threads == 1:
        return [one(t) for t in texts]
    with interface.concurrent_captures(model), ThreadPoolExecutor(threads) as pool:
        return list(pool.map(one, texts))


def _same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert sorted(x) == sorted(y)
        for name in x:
            assert torch.equal(x[name], y[name]), name


@pytest.mark.parametrize("name", ["bert", "gpt2", "bart"])
def test_captures_in_threads_run_at_once_and_equal_captures_one_at_a_time(name):
    model, tok = tiny.build(name), tiny.tokenizer()
    texts = TEXTS * 2
    options = {"value_norms": False}  # (value norms hook the model: such a capture runs alone, below)
    if model.config.is_encoder_decoder:
        options["target"] = "The Lessor shall pay."
    one = _captures(model, tok, texts, 1, **options)
    watched = _Watched(model)
    many = _captures(model, tok, texts, 3, **options)
    assert watched.most >= 2  # the passes did run at once
    _same(one, many)


def test_a_second_eager_pass_and_value_norms_run_alone_and_give_the_same_tensors():
    """Longformer's attention bypasses the interface: each capture makes a second, eager pass with hooks (it changes
    the model's attention implementation for the pass), which runs alone while the recording passes overlap;
    value norms hook every projection, so such a capture runs alone."""
    model, tok = longformer(), tiny.tokenizer()
    one = _captures(model, tok, TEXTS, 1, value_norms=False)
    watched = _Watched(model)
    _same(one, _captures(model, tok, TEXTS, 2, value_norms=False))
    assert watched.most >= 2 and not watched.second_not_alone
    bert = tiny.build("bert")
    one = _captures(bert, tok, TEXTS, 1, value_norms=True)
    watched = _Watched(bert, wait=0.3)
    _same(one, _captures(bert, tok, TEXTS, 2, value_norms=True))
    assert watched.most == 1


def test_the_shared_set_up_is_undone_on_every_exit_and_nested_holds_share_it():
    model = tiny.build("bert")
    model.train()  # a model left in training mode: evaluation mode for the block only
    configs = interface.model_configs(model)
    before = [c._attn_implementation for c in configs]
    assert interface.shared_model(model) is None
    with pytest.raises(RuntimeError, match="boom"), interface.concurrent_captures(model) as held:
        assert {c._attn_implementation for c in configs} == {interface.IMPL}
        assert not any(m.training for m in model.modules())
        with interface.concurrent_captures(model) as inner:
            assert inner is held
        assert interface.shared_model(model) is held  # the inner exit kept it
        raise RuntimeError("boom")
    assert [c._attn_implementation for c in configs] == before
    assert all(m.training for m in model.modules())
    assert interface.shared_model(model) is None
    from transformers.modeling_utils import AttentionInterface

    assert interface.IMPL not in AttentionInterface._global_mapping  # the registration is counted back to none


def test_a_writer_waits_for_the_readers_and_a_reader_for_the_writer():
    shared = interface.SharedModel({})
    reading, release, written = threading.Event(), threading.Event(), threading.Event()

    def reader():
        with shared.reading():
            reading.set()
            release.wait(10)

    def writer():
        with shared.writing():
            written.set()

    r = threading.Thread(target=reader)
    r.start()
    assert reading.wait(10)
    w = threading.Thread(target=writer)
    w.start()
    assert not written.wait(0.2)  # blocked while the reader reads
    release.set()
    assert written.wait(10)
    r.join(10)
    w.join(10)
    # a writer may read (nested), and a reader started while a writer writes waits for it
    order = []
    with shared.writing():
        with shared.reading():
            order.append("nested read")
        blocked = threading.Event()

        def late_reader():
            with shared.reading():
                order.append("late read")
            blocked.set()

        t = threading.Thread(target=late_reader)
        t.start()
        assert not blocked.wait(0.2)
        order.append("write done")
    assert blocked.wait(10)
    t.join(10)
    assert order == ["nested read", "write done", "late read"]


def test_a_capture_tokenizes_under_the_tokenizer_lock():
    """Two threads must not call one fast tokenizer at once (its Rust object may be reconfigured by a call)."""
    model, tok = tiny.build("bert"), tiny.tokenizer()
    done = threading.Event()

    def run():
        capture(model, tok, TEXTS[0], weights=False)
        done.set()

    with TOKENIZER_LOCK:
        t = threading.Thread(target=run)
        t.start()
        assert not done.wait(0.3)  # waits for the lock this thread holds
    assert done.wait(30)
    t.join(30)


def _docs(n: int) -> list[Document]:
    rows = lease_rows(n, seed=3)
    return [Document(row=i, id=r["id"], text=r["text"], query=r.get("query"), referents=r.get("referents"))
            for i, r in enumerate(rows)]


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_a_scan_in_worker_threads_gives_the_rows_of_one_worker_in_the_same_order(name):
    model, tok = tiny.build(name), tiny.tokenizer()
    docs = _docs(40)
    threads = torch.get_num_threads()

    def rows(workers):
        results = list(reduce.local_batches(model, tok, docs, batch_size=4, workers=workers))
        return (pd.concat([r.heads for r in results], ignore_index=True),
                pd.concat([r.documents for r in results], ignore_index=True))

    heads1, documents1 = rows(1)
    heads3, documents3 = rows(3)
    assert torch.get_num_threads() == threads  # given back
    pd.testing.assert_frame_equal(documents1, documents3)
    pd.testing.assert_frame_equal(heads1, heads3)  # exactly: the same rows, in the same order
    assert heads1["split_score"].notna().any()  # the split rows were written too
    assert interface.shared_model(model) is None


def test_a_scan_closed_early_gives_the_model_and_torch_threads_back():
    model, tok = tiny.build("bert"), tiny.tokenizer()
    threads = torch.get_num_threads()
    before = [c._attn_implementation for c in interface.model_configs(model)]
    batches = reduce.local_batches(model, tok, _docs(40), batch_size=4, workers=2)
    first = next(batches)
    assert len(first.documents) == 4
    if threads > 1:
        assert torch.get_num_threads() == max(1, threads // 2)  # divided between the workers meanwhile
    batches.close()
    assert torch.get_num_threads() == threads
    assert [c._attn_implementation for c in interface.model_configs(model)] == before
    assert interface.shared_model(model) is None


def test_the_default_workers():
    model = tiny.build("bert")
    expected = min(reduce.WORKERS, torch.get_num_threads())
    assert reduce.default_workers(model) == expected
    assert reduce.default_workers(model, prefetch=True) == 1
    assert reduce.default_workers(model, reduce.Options(routes=True)) == 1


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_a_bad_workers_count_is_refused_before_any_model_loads(bad, tmp_path):
    data = tmp_path / "c.jsonl"
    data.write_text('{"id": "a", "text": "x"}\n')
    with pytest.raises(InspectorError, match="--workers must be a whole number"):
        scan(data, tmp_path / "out", engine=Engine(workers=bad), progress=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_lazy_and_layer_selected_captures_in_threads_equal_captures_one_at_a_time(name):
    """A lazy capture runs sdpa where the model ran sdpa before: the recorder reads that from the set-up
    (the configs meanwhile name the recording attention)."""
    model, tok = tiny.build(name), tiny.tokenizer()
    for options in ({"weights": False}, {"weights": False, "layers": [1]}):
        options["value_norms"] = False
        one = _captures(model, tok, TEXTS * 2, 1, **options)
        _same(one, _captures(model, tok, TEXTS * 2, 3, **options))


def test_route_rows_in_worker_threads_equal_one_workers():
    """A route pass hooks the model's residual stream: beside other threads' passes it runs alone."""
    model, tok = tiny.build("gpt2"), tiny.tokenizer()
    docs = [d for d in _docs(24) if d.query is not None][:12]
    options = reduce.Options(routes=True)

    def rows(workers):
        results = list(reduce.local_batches(model, tok, docs, batch_size=2, options=options, workers=workers))
        return (pd.concat([r.heads for r in results], ignore_index=True),
                pd.concat([r.documents for r in results], ignore_index=True))

    heads1, documents1 = rows(1)
    assert (documents1["status"] == "ok").sum() >= len(docs) - 3  # (a route may be refused for a document: the same with 3)
    assert "on_route" in heads1.columns and heads1["on_route"].notna().any()
    heads2, documents2 = rows(3)
    pd.testing.assert_frame_equal(documents1, documents2)
    # the route's sums run on the worker's share of the torch threads: float rounding apart, the same rows
    pd.testing.assert_frame_equal(heads1, heads2, check_exact=False, rtol=1e-5, atol=1e-6)  # (as with one thread)
    assert heads1["on_route"].equals(heads2["on_route"])
    rank = [c for c in heads1.columns if c not in ("on_route", "route_share")]
    pd.testing.assert_frame_equal(heads1[rank], heads2[rank])  # the rank and split columns exactly


def test_the_set_up_outlives_every_holder_and_waits_for_the_passes_still_running():
    model = tiny.build("bert")
    configs = interface.model_configs(model)
    before = [c._attn_implementation for c in configs]
    entered, leave_first, first_left = threading.Event(), threading.Event(), threading.Event()

    def other_holder():
        with interface.concurrent_captures(model):
            entered.set()
            leave_first.wait(10)
        first_left.set()

    t = threading.Thread(target=other_holder)
    t.start()
    assert entered.wait(10)
    with interface.concurrent_captures(model) as held:
        leave_first.set()
        assert first_left.wait(10)
        assert interface.shared_model(model) is held  # the other thread's exit kept it: this block holds it
        assert {c._attn_implementation for c in configs} == {interface.IMPL}
        # a pass still running when the last holder leaves: the set-up is undone once it ends
        reading, release = threading.Event(), threading.Event()

        def pass_():
            with held.reading():
                reading.set()
                release.wait(10)
                assert not held.closed and {c._attn_implementation for c in configs} == {interface.IMPL}

        p = threading.Thread(target=pass_)
        p.start()
        assert reading.wait(10)
        threading.Timer(0.3, release.set).start()
    assert release.is_set()  # the exit waited for the pass
    p.join(10)
    t.join(10)
    assert [c._attn_implementation for c in configs] == before
    assert interface.shared_model(model) is None and held.closed


def test_an_interrupt_while_the_exit_waits_still_undoes_the_set_up(monkeypatch):
    model = tiny.build("bert")
    configs = interface.model_configs(model)
    before = [c._attn_implementation for c in configs]

    def interrupted(self):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), interface.concurrent_captures(model):  # noqa: PT012
        monkeypatch.setattr(interface.SharedModel, "writing", interrupted)
    assert [c._attn_implementation for c in configs] == before
    assert interface.shared_model(model) is None


def test_a_waiting_writer_goes_before_new_readers():
    shared = interface.SharedModel({})
    first, release, writer_in = threading.Event(), threading.Event(), threading.Event()
    order = []

    def reader(tag, started=None):
        with shared.reading():
            if started is not None:
                started.set()
                release.wait(10)
            order.append(tag)

    def writer():
        with shared.writing():
            order.append("writer")
            writer_in.set()

    r1 = threading.Thread(target=reader, args=("first reader", first))
    r1.start()
    assert first.wait(10)
    w = threading.Thread(target=writer)
    w.start()
    while not shared._waiting:  # the writer waits for the first reader
        threading.Event().wait(0.01)
    r2 = threading.Thread(target=reader, args=("late reader",))
    r2.start()
    release.set()
    for t in (r1, w, r2):
        t.join(10)
    assert order == ["first reader", "writer", "late reader"]


def test_sorting_by_tokens_holds_the_tokenizer_lock(tokenizer):
    docs = _docs(12)
    done = threading.Event()
    found = []

    def run():
        found.append(reduce.token_lengths(docs, tokenizer))
        done.set()

    with TOKENIZER_LOCK:
        t = threading.Thread(target=run)
        t.start()
        assert not done.wait(0.3)
    assert done.wait(30)
    t.join(30)
    assert found[0] is not None and len(found[0]) == len(docs)


def test_workers_as_numpy_integers_are_taken():
    import numpy as np

    assert reduce.check_workers(np.int64(2)) == 2
    for bad in (0, -3, 2.5, True, "2"):
        with pytest.raises(InspectorError, match="--workers must be a whole number"):
            reduce.check_workers(bad)
