"""``inspector scan``: a whole corpus reduced to per-head statistics in a resumable Parquet folder.

:func:`scan` reads the corpus (:mod:`inspector.corpus.documents`), skips the documents a previous run of the
same scan already committed (:mod:`inspector.corpus.folder`), reduces the rest batch by batch with the
per-document function of :mod:`inspector.corpus.reduce` -- in this process (``Engine("local")``) or on Ray
actors (``Engine("ray")``, :mod:`inspector.corpus.ray_engine`; Ray is imported only then) -- and commits each
batch as it comes. The model and the engine are values (:class:`~inspector.corpus.engine.ModelSpec`,
:class:`~inspector.corpus.engine.Engine`), checked when made. A progress bar shows documents per second and the time left.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inspector.corpus import folder as folder_mod
from inspector.corpus.documents import Corpus, Document, Fields
from inspector.corpus.engine import Engine, ModelSpec
from inspector.corpus.folder import Committer, ScanFolder, corpus_sha256
from inspector.corpus.reduce import Options, local_batches
from inspector.errors import InspectorError
from inspector.store.files import SIGNALS


@dataclass
class ScanSummary:
    """What one scan did: the folder ``out``; documents in the corpus (``total``), committed by an earlier
    run (``skipped``), scanned now, failed with an error, and the Parquet parts written."""

    out: Path
    total: int  # documents in the corpus
    skipped: int  # committed by an earlier run
    scanned: int  # committed by this run
    errors: int  # of those, recorded with an error
    errors_before: int = 0  # recorded with an error by earlier runs of this scan


def _pending(corpus: Corpus, done: set[str]) -> Iterator[Document]:
    """Documents not committed yet; a repeated id is a bad document (ids must be unique to resume)."""
    done = set(done)  # as committed before this run (the folder's own set grows as batches commit)
    seen: set[str] = set()
    for doc in corpus:
        if doc.id in seen:
            doc.problem = doc.problem or f"id {doc.id!r} repeats an earlier row's id: ids must be unique"
            doc.id = f"{doc.id}#row{doc.row}"
        seen.add(doc.id)
        if doc.id in done:
            continue
        yield doc


def scan_meta(corpus: Corpus, model_name: str, options: Options) -> dict[str, Any]:
    """What a resumed scan must share with the scan it continues (``corpus_sha256``: the corpus's content,
    so a file changed under the same path is refused)."""
    return {
        "corpus": str(corpus.path.resolve()),
        "fields": corpus.fields.to_dict(),
        "model": model_name,
        "options": options.to_dict(),
        "corpus_sha256": corpus_sha256(corpus.path),
    }


def _first_pending(corpus: Corpus, folder: ScanFolder) -> Document | None:
    """The first document the scan in ``folder`` has not committed (None: nothing left), read without
    the model and without writing."""
    from inspector.corpus.folder import committed_documents

    done = set(committed_documents(folder.out)["id"].astype(str)) if (folder.out / "scan.json").is_file() else set()
    return next(_pending(corpus, done), None)


def _commit_all(folder: ScanFolder, results, bar) -> tuple[int, int]:
    """Commit the batches as they come, in a background writer (:class:`~inspector.corpus.folder.Committer`:
    the next batch is computed while this one is written; batches grouped into parts of about
    :data:`~inspector.corpus.folder.GROUP_DOCUMENTS` documents or a second's work); (documents, of them with an error).

    However it ends (the last batch, a failed write, an error, a signal), the clean-up runs whole, in this order and
    uninterrupted (:meth:`~inspector.store.files.Signals.hold`: a signal meanwhile is raised after it): the progress
    bar is closed, the engine's workers are stopped, every batch handed over is committed (or dropped after a failed
    write) and the writer thread joined, and ``documents.parquet`` is rewritten. A failure of the writer is raised
    (it ends the command with one line), unless another failure is already on its way; a signal some library
    swallowed (tqdm's ``__del__``) stops the scan at the next batch (:meth:`~inspector.store.files.Signals.check`)."""
    scanned = errors = 0
    committer = Committer(folder, group_documents=folder_mod.GROUP_DOCUMENTS, group_seconds=folder_mod.GROUP_SECONDS)
    failing = True
    try:
        for result in results:
            SIGNALS.check()
            committer.commit(result.documents_table, result.heads_table)
            n = result.documents_table.num_rows
            scanned += n
            errors += sum(s != "ok" for s in result.documents_table.column("status").to_pylist())
            if bar is not None:
                bar.update(n)
                bar.set_postfix(errors=errors, refresh=False)
        SIGNALS.check()
        failing = False
    finally:
        with SIGNALS.hold():
            _clean_up(folder, results, bar, committer, failing)
    return scanned, errors


def _clean_up(folder: ScanFolder, results, bar, committer: Committer, failing: bool) -> None:
    """:func:`_commit_all`'s end: the bar, the workers, the writer, ``documents.parquet``; raises the writer's or the
    rewrite's failure unless ``failing`` (another failure is on its way)."""
    if bar is not None:
        bar.close()  # first: what is printed next starts on a line of its own
    close = getattr(results, "close", None)
    try:
        if close is not None:
            close()
    finally:
        failure = committer.stop()
    try:
        folder.flush()
    except InspectorError:
        if failure is None and not failing:
            raise  # a failure already on its way is the error to report
    if failure is not None and not failing:
        raise failure


def pending_documents(corpus: Corpus, done: set[str]) -> Iterator[Document]:
    """The documents of ``corpus`` a scan has not committed (``done``: the committed ids), in corpus order; a
    repeated id is a bad document (ids must be unique to resume). What every scan of a folder reads, the evaluation
    scan (:mod:`inspector.investigate.evaluation`) as well."""
    return _pending(corpus, done)


def commit_batches(folder: ScanFolder, results, bar) -> tuple[int, int]:
    """Commit ``results`` (objects with ``documents_table`` and ``heads_table``, Arrow tables or DataFrames) into
    ``folder`` as they come, updating the progress ``bar`` (or None), as :func:`scan` does: the background writer
    (:class:`~inspector.corpus.folder.Committer`), then ``documents.parquet`` rewritten even after a failure.
    Returns (documents committed, of them with an error)."""
    return _commit_all(folder, results, bar)


def scan(
    data: str | os.PathLike,
    out: str | os.PathLike,
    *,
    model: ModelSpec = ModelSpec(),
    engine: Engine = Engine(),
    fields: Fields = Fields(),
    options: Options = Options(),
    progress: bool = True,
    loaded=None,
    allow: tuple[str, ...] = (),
    status=None,
) -> ScanSummary:
    """Scan the corpus ``data`` into the folder ``out`` (created, or resumed when it holds this scan).

    ``model`` (:class:`~inspector.corpus.engine.ModelSpec`) names the model, its device and whether its own code
    may run; ``loaded`` (a :class:`~inspector.capture.models.LoadedModel`) reuses a model already in memory for the
    local engine instead. ``engine`` (:class:`~inspector.corpus.engine.Engine`) says where and how: its
    ``batch_size`` documents per forward pass; its ``workers`` the Ray engine's actors, or the local engine's worker
    threads, each reducing a batch of its own on its share of the torch threads (default:
    :func:`~inspector.corpus.reduce.default_workers`: two on a CPU where torch has two threads or more, else one;
    one on a GPU, with route rows or with ``prefetch`` True); its ``num_cpus`` the CPUs a local Ray instance uses
    (default: all), shared by its actors as torch threads; its ``prefetch`` makes a local engine of one worker
    capture the next batch while it analyses this one (True; at most two batches' captures in memory) or capture
    and analyse in turn (False); by default (None) it is on for a model on a GPU and off on the CPU
    (:func:`~inspector.corpus.reduce.local_batches`). ``status`` (a function of one line) is told when the model
    starts loading, after the corpus, options and folder have been checked; ``allow`` names files that may already
    be in a new ``out`` (the demo corpus). Raises :class:`InspectorError` for a bad corpus, options or folder (a
    damaged ``scan.json`` or part, a corpus changed since the scan began), before any model loads, and for a
    write the system refuses (read-only folder, full disk; what was committed stays, and a resume continues
    from it); bad documents are recorded in ``documents.parquet`` and never stop the scan. A resumed scan with
    nothing left loads no model.
    """
    if not isinstance(model, ModelSpec) or not isinstance(engine, Engine):
        raise InspectorError("scan takes model=ModelSpec(...) and engine=Engine(...) (inspector.corpus.engine)")
    corpus = Corpus(data, fields)
    total = len(corpus)
    from inspector.capture.models import DEFAULT_MODEL

    name = loaded.name if loaded is not None else (model.name or DEFAULT_MODEL)
    folder = ScanFolder(out, scan_meta(corpus, name, options), allow=allow)
    first = _first_pending(corpus, folder)
    if engine.kind == "local" and loaded is None and first is not None:
        if status is not None:
            status(f"loading model {model.label} ...")
        loaded = model.load()
    if options.routes and first is not None:  # before any document is scanned
        from inspector.corpus.route_rows import check_config, check_loaded

        if loaded is not None:
            check_loaded(loaded.model, name)
        else:
            check_config(model.name, name, model.trust_remote_code)
    if (loaded is not None and engine.batch_size > 1 and getattr(loaded.tokenizer, "pad_token", None) is None
            and progress):
        print("inspector: this tokenizer has no padding token, so documents are captured one at a time "
              "(--batch-size has no effect)", file=sys.stderr)
    folder.open()
    skipped = folder.committed
    errors_before = folder.errors
    if first is None:
        results: Any = iter(())
    elif engine.kind == "local":
        results = local_batches(loaded.model, loaded.tokenizer, _pending(corpus, folder.done),
                                batch_size=engine.batch_size, options=options, prefetch=engine.prefetch,
                                workers=engine.workers)
    else:
        from inspector.corpus.ray_engine import ray_batches

        results = ray_batches(_pending(corpus, folder.done), model=model, engine=engine, options=options)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, initial=skipped, desc="scanning", unit="doc", file=sys.stderr, dynamic_ncols=True,
                   disable=None)
    scanned, errors = _commit_all(folder, results, bar)
    return ScanSummary(out=folder.out, total=total, skipped=skipped, scanned=scanned, errors=errors,
                       errors_before=errors_before)
