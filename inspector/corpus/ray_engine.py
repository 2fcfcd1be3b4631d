"""The Ray engine of ``inspector scan``: the same per-document function on Ray Data actors.

The pending documents become a Ray Dataset; one ``map_batches`` stage runs :class:`Reducer` actors,
each holding the model once (one actor per GPU, or per worker), and each calling
:func:`inspector.corpus.reduce.reduce_batch` -- the function the local engine calls -- on ``batch_size``
documents at a time. Each output row is one reduced batch: its ``documents`` and ``heads`` tables as Arrow
IPC bytes (exact floats, the local engine's column types); the driver commits them to the scan folder as they stream back, so
resuming works as with the local engine.

``address`` joins an existing cluster (``ray://head:10001``, ``auto``); without it a Ray instance
already started in this process is used, or a local one is started (bound to 127.0.0.1, no
dashboard) and shut down when the scan ends. Every node needs inspector and its model installed
(``pip install 'attention-inspector[ray]'``). The documents still to scan are handed to Ray :data:`WINDOW` at a time
(one Dataset each, its actors loading the model anew), so the driver and Ray's object store hold at most
that many, whatever the corpus's size.

Ray is an optional dependency: only this module imports it, and only ``engine="ray"`` imports this
module.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pandas as pd

from inspector.corpus.documents import Document
from inspector.corpus.engine import Engine, ModelSpec
from inspector.corpus.reduce import BatchResult, Options, check_document, length_of
from inspector.errors import InspectorError

WINDOW = 20_000  # documents per Ray Dataset: the most the driver lists at once (each window loads the model anew)


def _item(doc: Document) -> dict[str, Any]:
    """A document as a Ray row: plain, Arrow-typed values (a value Arrow cannot type is a problem)."""
    problem = check_document(doc)
    return {
        "row": int(doc.row), "id": str(doc.id), "problem": problem or "",
        "text": doc.text if not problem else "", "target": doc.target if not problem and doc.target is not None else "",
        "has_target": doc.target is not None and not problem, "query": doc.query or "",
        "referents": list(doc.referents) if doc.referents and not problem else [],
        "occurrence": int(doc.occurrence) if doc.occurrence is not None else 0,
    }


def _document(r: dict[str, Any]) -> Document:
    refs = r["referents"]
    refs = [str(x) for x in (refs.tolist() if hasattr(refs, "tolist") else refs)]
    return Document(row=int(r["row"]), id=str(r["id"]), text=r["text"], target=r["target"] if r["has_target"] else None,
                    query=r["query"] or None, referents=refs or None, occurrence=int(r["occurrence"]) or None,
                    problem=r["problem"] or None)


def to_ipc(rows) -> bytes:
    """Rows as Arrow IPC stream bytes (how rows cross between Ray actors and the driver; no pickle): an Arrow table
    as it is (its schema and pandas metadata travel with it), a DataFrame as its ``arrow_table``."""
    import pyarrow as pa

    from inspector.corpus.tables import arrow_table

    table = rows if isinstance(rows, pa.Table) else arrow_table(rows)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def table_from_ipc(data: bytes):
    """The Arrow table of :func:`to_ipc` bytes."""
    import pyarrow as pa

    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


class Reducer:
    """A Ray actor holding one model (``model``, on the device the pool gives it); called with a batch of
    documents, returns their rows."""

    def __init__(self, model: ModelSpec, options: dict, threads: int | None):
        if threads:
            import torch

            torch.set_num_threads(threads)
        from inspector.corpus.forward_sums import StopPlan

        self.lm = model.load()
        self.options = Options(**options)
        self.plan = StopPlan.of(self.lm.model)  # its passes end after the last attention call, as the local engine's

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        """One row for the whole batch: its ``documents`` and ``heads`` tables as Arrow IPC bytes (exact floats,
        the local engine's types), so neither the actor nor the driver does any work per document."""
        from inspector.corpus.reduce import reduce_batch

        docs = [_document(r) for r in batch.to_dict("records")]
        result = reduce_batch(self.lm.model, self.lm.tokenizer, docs, self.options, plan=self.plan)
        return pd.DataFrame({"documents": [to_ipc(result.documents_table)],
                             "heads": [to_ipc(result.heads_table) if len(result.heads_table) else b""]})


@dataclass(frozen=True)
class _Pool:
    """The actors of a Ray scan: how many (``n``), GPUs each (``gpus``: 0 or 1) and torch threads each
    (``threads``; None: Ray's default, on a cluster)."""

    n: int
    gpus: int
    threads: int | None


def _workers(ray, workers: int | None) -> tuple[int, int]:
    """(actors, GPUs per actor): one per GPU when the cluster has GPUs, else one per node."""
    gpus = int(ray.cluster_resources().get("GPU", 0))
    if workers is None:
        workers = gpus or max(1, len([n for n in ray.nodes() if n.get("Alive")]))
    if workers < 1:
        raise InspectorError(f"--workers must be at least 1, not {workers}")
    return workers, 1 if gpus >= workers else 0


def _reachable(address: str, timeout: float = 5.0) -> None:
    """InspectorError unless a ``HOST:PORT`` (or ``ray://HOST:PORT``) address takes a TCP connection within
    ``timeout`` seconds: ``ray.init`` retries an address where nothing listens for minutes, deaf to Ctrl-C."""
    import socket

    rest = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = rest.rpartition(":")
    if not sep or not re.fullmatch(r"[0-9]{1,5}", port):  # not str.isdigit: '²' passes it
        return  # "auto", "local", or a form Ray resolves itself
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as exc:
        raise InspectorError(f"nothing answers at the Ray address {address} ({exc.strerror or exc}): check --ray-address "
                             "(HOST:PORT of the head node's GCS, ray://HOST:10001, or auto on a cluster node), "
                             "or use --engine local") from None


def _join(ray, address: str) -> None:
    """``ray.init(address=...)``, with the fix named in one line when the cluster cannot be joined."""
    _reachable(address)
    try:
        ray.init(address=address, log_to_driver=False)
    except Exception as exc:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError or its own errors here
        chain, e = [], exc
        while e is not None and len(chain) < 8:
            chain.append(f"{type(e).__name__}: {e}")
            e = e.__cause__ or e.__context__
        text = " ".join(chain)
        if "InvalidAuthToken" in text or "AuthenticationError" in text:
            raise InspectorError(
                f"the Ray cluster at {address} asks for its token (Ray >= 2.52 starts clusters with token "
                "authentication): set RAY_AUTH_MODE=token, with the cluster's token in ~/.ray/auth_token or "
                "RAY_AUTH_TOKEN") from None
        raise InspectorError(f"cannot join the Ray cluster at {address} ({chain[0][:300]}): check --ray-address "
                             "(HOST:PORT of the head node, ray://HOST:10001, or auto on a cluster node)") from None


def _map(ds, actor, kwargs: dict, model: ModelSpec, engine: Engine, pool: _Pool):
    """``ds`` mapped by a pool of ``pool.n`` ``actor`` actors (:class:`Reducer`, or another of its form: constructed
    with ``kwargs``, ``model`` -- on ``cuda`` where the pool has GPUs -- and ``threads``), ``engine.batch_size``
    documents per call."""
    import ray

    return ds.map_batches(
        actor, batch_size=engine.batch_size, batch_format="pandas", compute=ray.data.ActorPoolStrategy(size=pool.n),
        fn_constructor_kwargs={**kwargs, "model": model.on("cuda") if pool.gpus else model, "threads": pool.threads},
        num_gpus=pool.gpus, num_cpus=pool.threads or 1,
        # Ray Data passes its actors' constructor arguments by reference and, with restarts on (its
        # default), logs an error-tagged core_worker line for every run; an actor lost midway fails the
        # scan instead, which resumes from its committed parts
        max_restarts=0,
    )


def _window(docs: Iterator[Document]) -> list[dict]:
    """The next :data:`WINDOW` documents as Ray items, sorted by length (:func:`~inspector.corpus.reduce.length_of`,
    stable), so that each actor's batch pads little, as the local engine's batches
    (:func:`~inspector.corpus.reduce.length_batches`)."""
    from itertools import islice

    return [_item(d) for d in sorted(islice(docs, WINDOW), key=length_of)]


def ray_batches(docs: Iterable[Document], *, model: ModelSpec, engine: Engine,
                options: Options = Options()) -> Iterator[BatchResult]:
    """Reduce ``docs`` on Ray actors, each holding ``model``, as ``engine`` says (its batch size, actors, address and
    CPUs); yields a :class:`BatchResult` per batch as it completes (in any order)."""
    docs = iter(docs)
    yield from actor_batches(lambda: _window(docs), Reducer, {"options": options.to_dict()}, model=model, engine=engine)


def actor_batches(window, actor, kwargs: dict, *, model: ModelSpec, engine: Engine) -> Iterator[BatchResult]:
    """The Ray driver of :func:`ray_batches`, for any actor of :class:`Reducer`'s form (the evaluation scan's
    too: :mod:`inspector.investigate.evaluation`): ``window()`` gives the next items (plain rows; empty: done),
    ``actor`` is constructed with ``kwargs``, ``model`` (a :class:`~inspector.corpus.engine.ModelSpec`, its device
    ``cuda`` where the actor has a GPU) and ``threads`` on each worker and returns, per batch of
    ``engine.batch_size`` items, rows of ``documents`` and ``heads`` Arrow IPC bytes (:func:`to_ipc`); yields them as
    :class:`BatchResult` as they complete. Starts (and stops) a local Ray instance of ``engine.num_cpus`` CPUs, or
    joins ``engine.address``, as the module docstring says."""
    if engine.kind != "ray":
        raise InspectorError(f"the Ray engine was handed engine {engine.kind!r}: give Engine('ray', ...)")
    try:
        import ray
        import ray.data
    except ImportError:
        raise InspectorError("--engine ray needs Ray: pip install 'attention-inspector[ray]' (or use --engine local)") from None
    items = window()
    if not items:
        return
    started = False
    if not ray.is_initialized():
        if engine.address:
            _join(ray, engine.address)
        else:
            cpus = engine.num_cpus or os.cpu_count() or 1
            ray.init(num_cpus=cpus + 1, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
                     configure_logging=False)
        started = True
    try:
        n, gpus = _workers(ray, engine.workers)
        local = not engine.address and started
        pool = _Pool(n, gpus, max(1, (engine.num_cpus or os.cpu_count() or 1) // n) if local else None)
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False
        ctx.execution_options.verbose_progress = False
        while items:
            ds = ray.data.from_items(items, override_num_blocks=max(1, min(len(items) // engine.batch_size, 64 * n)))
            with warnings.catch_warnings():  # max_restarts has no named parameter before Ray 2.64 (pyproject pins below it)
                warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
                ds = _map(ds, actor, kwargs, model, engine, pool)
            del items  # Ray holds the window now
            for out in ds.iter_batches(batch_size=None, batch_format="pandas"):
                for documents, heads in zip(out["documents"], out["heads"], strict=True):  # one row per reduced batch
                    # the local engine's tables, schema and pandas metadata included: the Parquet parts match
                    yield BatchResult(table_from_ipc(documents), table_from_ipc(heads) if len(heads) else pd.DataFrame())
            del ds
            items = window()
    finally:
        if started:
            ray.shutdown()
