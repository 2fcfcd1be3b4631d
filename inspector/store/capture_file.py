"""The capture: site metadata, input records and tensors, and its file format.

A capture file is one ``.safetensors`` file (no pickle). Tensors are named ``<site>/q``,
``<site>/k``, ``<site>/v``, ``<site>/weights`` and ``<site>/value_norm`` (and ``<site>/global_rows`` of a banded or
block-local site, whose weights are stored compactly: :mod:`inspector.store.band`), plus the small tensors of compact
masks (``<mask>.key_padding``, ``<mask>.packed``, ``<mask>.bias``, ``<mask>.globals``; see :mod:`inspector.store.masks`);
the header's
``__metadata__`` holds one key, ``inspector``, whose value is a JSON document (schema, model
provenance, inputs, sites and mask specs; see docs/file-format.md). Schema 1 files (one
dense float ``<site>/mask`` tensor per mask) still open. Files are written atomically (temporary
file, then rename) and opened memory-mapped, so a head's rows can be read without loading the rest;
every file is checked on open (:mod:`inspector.store.validate`) and every row read is checked too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from inspector.errors import InspectorError
from inspector.store import attention, band, masks, validate
from inspector.store.schema import InputRecord, Site

SCHEMA = 2
_DTYPE_NAMES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}
PARTS = ("q", "k", "v", "weights", "mask", "value_norm")


class _FileTensors:
    """Tensors read lazily from a memory-mapped safetensors file."""

    def __init__(self, path: Path):
        from safetensors import safe_open

        self.path = path
        self._handle = safe_open(str(path), framework="pt", device="cpu")
        self._names = set(self._handle.keys())

    def __contains__(self, name: str) -> bool:
        return name in self._names

    def keys(self):
        return sorted(self._names)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._handle.get_tensor(name)

    def shape(self, name: str) -> list[int]:
        return list(self._handle.get_slice(name).get_shape())

    def dtype(self, name: str) -> str:
        return self._handle.get_slice(name).get_dtype()

    def slice(self, name: str, index: tuple) -> torch.Tensor:
        return self._handle.get_slice(name)[index]


class _MemTensors(dict):
    def shape(self, name: str) -> list[int]:
        return list(self[name].shape)

    def dtype(self, name: str) -> str:
        return validate.DTYPE_CODES.get(self[name].dtype, str(self[name].dtype))

    def slice(self, name: str, index: tuple) -> torch.Tensor:
        return self[name][index]


class Capture:
    """What one forward pass computed in its attention layers, with the inputs that produced it."""

    def __init__(self, meta: dict[str, Any], sites: list[Site], tensors: dict[str, torch.Tensor] | _FileTensors):
        self.meta = meta
        self.sites = sites
        self._by_name = {s.name: s for s in sites}
        self.tensors = tensors if isinstance(tensors, _FileTensors) else _MemTensors(tensors)
        self.inputs = [InputRecord.from_dict(d) if isinstance(d, dict) else d for d in meta.get("inputs", [])]
        # mask name -> spec (inspector.store.masks); a mask stored as one dense float tensor (schema 1, or a capture
        # built by hand) is a spec whose bias is that tensor
        self.masks: dict[str, dict] = dict(meta.get("masks") or {})
        for s in sites:
            if s.mask is not None and s.mask not in self.masks and s.mask in self.tensors:
                code = self.tensors.dtype(s.mask)
                self.masks[s.mask] = {"dtype": _DTYPE_NAMES.get(code, "float32"), "shape": self.tensors.shape(s.mask), "fill": None,
                    "visible": None, "offset": 0, "window": None, "key_padding": None, "packed": None, "bias": s.mask}
        self.source: str | Path = "capture"  # what row checks name: the file, once loaded
        # the last K read by recompute(), keyed by (tensor name, batch, kv heads): reading a chunk of query
        # rows after another then reads K once per site instead of once per chunk
        self._k_cache: tuple[tuple, torch.Tensor] | None = None

    def __repr__(self) -> str:
        """One line a notebook or a REPL shows: the model, the batch, the tokens per role, the sites and the storage,
        e.g. ``Capture of 'minilm' (1 row; source 14 tokens; 6 sites x 12 heads; lazy (Q/K/V + mask))``."""
        lengths = "; ".join(f"{role} {len(self.records(role).ids)} tokens" for role in self.roles())
        heads = sorted({s.num_heads for s in self.sites})
        shape = f"{len(self.sites)} sites x {heads[0]} heads" if len(heads) == 1 else f"{len(self.sites)} sites"
        rows = f"{self.batch_size} row{'s' if self.batch_size != 1 else ''}"
        return f"Capture of {self.model_name!r} ({rows}; {lengths or 'no inputs'}; {shape}; {self.storage()})"

    # ---- metadata -------------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        """The captured model's name (path or hub id), ``?`` when the file does not say."""
        return self.meta.get("model", {}).get("name", "?")

    @property
    def batch_size(self) -> int:
        """Rows in the captured batch."""
        return 1 + max((r.batch for r in self.inputs), default=0)

    @property
    def lazy(self) -> bool:
        """True when no site stores weights (they are recomputed from Q, K and the mask on demand)."""
        return not any("weights" in s.parts for s in self.sites)

    def storage(self) -> str:
        """What the file stores, in words, for ``info``, ``capture``'s last line, notebooks and the app:
        ``full (with weights)``, ``lazy (Q/K/V + mask)``, or ``mixed: ...`` counting both kinds of site. A lazy
        capture (``options.weights`` false) still stores the weights of sites they cannot be recomputed at
        (captured through ``output_attentions``, e.g. LED's, LongT5's and Pegasus-X's long-document encoders, or
        passing extra arguments such as attention sinks); the words then say so."""
        stored = sum("weights" in s.parts for s in self.sites)
        if not stored:
            return "lazy (Q/K/V + mask)"
        if stored == len(self.sites):
            words = "full (with weights)"
        else:
            words = (f"mixed: {len(self.sites) - stored} of {len(self.sites)} sites lazy (Q/K/V + mask), {stored} with "
                     "weights")
        if self.meta.get("options", {}).get("weights") is False:
            words += " (captured lazily: a site whose weights cannot be recomputed from Q and K stores them)"
        return words

    def site(self, name: str) -> Site:
        """The site named ``name``.

        Raises :class:`InspectorError` naming the closest site names."""
        try:
            return self._by_name[name]
        except KeyError:
            near = ", ".join(sorted(self._by_name)[:6])
            raise InspectorError(f"no site {name!r} in this capture; sites are: {near}{' ...' if len(self._by_name) > 6 else ''}") from None

    def select(self, kinds: str | list[str] | None = None, stacks: list[str] | None = None, layers: list[int] | None = None) -> list[Site]:
        """The sites of the given kinds (``self``, ``causal``, ``cross``), stacks and layers (None: any), in order."""
        kinds = [kinds] if isinstance(kinds, str) else kinds
        return [
            s for s in self.sites
            if (not kinds or s.kind in kinds) and (not stacks or s.stack in stacks) and (layers is None or s.layer in layers)
        ]

    def records(self, role: str, batch: int = 0) -> InputRecord:
        """The input record of ``role`` (``source`` or ``target``) in batch row ``batch``.

        Raises :class:`InspectorError` when the capture has no such input."""
        for r in self.inputs:
            if r.role == role and r.batch == batch:
                return r
        raise InspectorError(f"this capture has no {role} input for batch row {batch}")

    def roles(self) -> list[str]:
        """The input roles present, ``source`` first."""
        return sorted({r.role for r in self.inputs}, key=lambda r: (r != "source", r))

    def axis(self, site: Site | str, which: str = "query", batch: int = 0) -> list[tuple[InputRecord, int]]:
        """(record, index in record) for each position of the site's query or key axis (a new list)."""
        return list(self._axis(site, which, batch)[0])

    def tokens(self, site: Site | str, which: str = "query", batch: int = 0) -> list[str]:
        """The token texts along the site's ``which`` axis (``query`` or ``key``) of batch row ``batch``,
        one per position (its roles' tokens in order)."""
        return list(self._axis(site, which, batch)[1])

    def flags(self, site: Site | str, which: str = "query", batch: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """(special, padding) boolean vectors ``[position]`` along an axis (new tensors the caller may change)."""
        _, _, special, padding = self._axis(site, which, batch)
        return special.clone(), padding.clone()

    def _axis(self, site: Site | str, which: str, batch: int) -> tuple:
        """``(axis, tokens, special, padding)`` of an axis, built once per (roles, batch row): every site of a
        stack reads the same axis, and an analysis reads it once per site. The records are not changed after
        the capture is made (the padding cache and the mask rows assume the same)."""
        site = self.site(site) if isinstance(site, str) else site
        roles = tuple(site.query_input if which == "query" else site.key_input)
        cache = self.__dict__.setdefault("_axis_cache", {})
        if (roles, batch) not in cache:
            ax: list[tuple[InputRecord, int]] = []
            for role in roles:
                rec = self.records(role, batch)
                ax += [(rec, i) for i in range(len(rec.ids))]
            tokens = tuple(rec.tokens[i] for rec, i in ax)
            special = torch.tensor([rec.special[i] for rec, i in ax], dtype=torch.bool)
            padding = torch.tensor([rec.padding[i] for rec, i in ax], dtype=torch.bool)
            cache[(roles, batch)] = (tuple(ax), tokens, special, padding)
        return cache[(roles, batch)]

    # ---- tensors --------------------------------------------------------------------------
    def has(self, site: Site | str, part: str) -> bool:
        """Whether the site stores ``part`` (``q``, ``k``, ``v``, ``weights``, ``mask``, ...) or, for
        ``weights``, can recompute it."""
        site = self.site(site) if isinstance(site, str) else site
        if part == "mask":
            return site.mask is not None
        return part in site.parts

    def tensor(self, site: Site | str, part: str) -> torch.Tensor:
        """The stored tensor ``part`` of the site, as saved: ``q`` ``[batch, head, query, d_head]``, ``k``/``v``
        ``[batch, kv_head, key, d_head]``, ``weights`` ``[batch, head, query, key]``, ``mask`` ``[batch, 1|head, query, key]``.

        Raises :class:`InspectorError` when the site does not hold it (naming what it holds)."""
        site = self.site(site) if isinstance(site, str) else site
        if not self.has(site, part):
            raise InspectorError(f"site {site.name} has no stored {part!r}; this capture holds {', '.join(site.parts) or 'weights only'}")
        if part == "mask":  # the whole additive mask [batch|1, head|1, query|1, key], in the model's dtype
            return masks.dense(self.masks[site.mask], self.tensors)
        if part == "weights" and site.band is not None:  # per-token [batch, head, query, key], float32
            return torch.stack([self.weights(site, b) for b in range(self.batch_size)])
        return self.tensors[site.tensor_name(part)]

    def mask_rows(self, site: Site, batch: int, queries: slice | None = None) -> torch.Tensor | None:
        """The additive mask for one batch row as ``[head or 1, query, key]`` (float32), or None; equal
        element for element to what the model added (recomputed from the compact mask spec)."""
        if site.mask is None:
            return None
        # the rows just built are asked for again by the next reader of the same rows (weights, then
        # analysis.visible_keys): one entry is kept; callers must not modify it in place
        key = (site.mask, batch, None if queries is None else queries.indices(site.query_len))
        cached = self.__dict__.get("_mask_cache")
        if cached is not None and cached[0] == key:
            return cached[1]
        rows = masks.rows(self.masks[site.mask], self.tensors, batch, queries)
        self._mask_cache = (key, rows)
        return rows

    def value_norms(self, site: Site | str, batch: int = 0) -> torch.Tensor | None:
        """``[head, key]`` float32: ``||v_j W_O^h||``, the size of what key j sends through head h (the value
        times head h's slice of the output projection, bias excluded; Kobayashi et al. 2020), or None when
        the site has none (``site.value_norm_note`` says why)."""
        site = self.site(site) if isinstance(site, str) else site
        if "value_norm" not in site.parts:
            return None
        return self._rows(site.tensor_name("value_norm"), batch, list(range(site.num_heads)), slice(None), site.num_heads)

    def weights(
        self, site: Site | str, batch: int = 0, heads: list[int] | None = None, queries: slice | None = None
    ) -> torch.Tensor:
        """Attention weights ``[head, query, key]`` (float32) for one batch row.

        Read from the file when stored; otherwise recomputed from Q, K and the mask, only for the
        requested heads and query rows.
        """
        site = self.site(site) if isinstance(site, str) else site
        heads = list(range(site.num_heads)) if heads is None else list(heads)
        for h in heads:
            if not 0 <= h < site.num_heads:
                raise InspectorError(f"head {h} does not exist at {site.name}: it has heads 0..{site.num_heads - 1}")
        qs = queries if queries is not None else slice(None)
        mask = self.mask_rows(site, batch, qs)
        if site.band is not None:  # each query's window and the global keys, moved to their key tokens
            rows_name = site.tensor_name("global_rows")
            spec = self.masks[site.mask]
            w = band.expand(self._rows(site.tensor_name("weights"), batch, heads, qs, site.num_heads),
                            lambda slots: self._rows(rows_name, batch, heads, slots, site.num_heads),
                            self._globals(site, batch), band.geometry(spec), queries=range(*qs.indices(site.query_len)),
                            query_len=site.query_len, global_rows=self.tensors.shape(rows_name)[2])
            code = validate.precision(self.tensors.dtype(site.tensor_name("weights")), validate.model_code(self.meta))
        elif "weights" in site.parts:
            w = self._rows(site.tensor_name("weights"), batch, heads, qs, site.num_heads)
            # the coarser of the stored dtype and the model's own: half-precision weights stored as float32 keep their rounding
            code = validate.precision(self.tensors.dtype(site.tensor_name("weights")), validate.model_code(self.meta))
        else:
            w = self.recompute(site, batch, heads, qs, mask=mask)
            code = "F32"
        if "weights" not in site.parts and bool(torch.isfinite(w.sum(-1)).all()):
            # recomputed here: a softmax over the stored mask is in [0, 1], sums to 1 and is 0 on hidden
            # keys by construction, so only NaN or infinity (from Q, K or the mask) can be wrong, and any
            # such value makes its row's sum non-finite: one reduction instead of the full check
            return w
        rows = range(*qs.indices(site.query_len))
        vis = validate.visible_rows(site, mask if mask is None or mask.shape[0] == 1 else mask[heads], rows)
        pad_q, pad_k = self._padding(site, "query", batch)[qs], self._padding(site, "key", batch)
        validate.check_rows(str(self.source), site, w, vis & ~pad_k, heads=heads, queries=rows, dtype_code=code, skip=pad_q)
        return w

    def _globals(self, site: Site, batch: int) -> torch.Tensor:
        """``[key]`` bool: the global tokens of a banded site's batch row (its band mask's ``globals``)."""
        name = self.masks[site.mask]["globals"]
        b = batch if self.tensors.shape(name)[0] > 1 else 0
        return self.tensors.slice(name, (slice(b, b + 1),))[0].bool()

    def _padding(self, site: Site, which: str, batch: int) -> torch.Tensor:
        """The padding flags along an axis (the cached tensor itself, not a copy: rows are checked on every read)."""
        return self._axis(site, which, batch)[3]

    def _rows(self, name: str, batch: int, heads: list[int], rows: slice, num_heads: int) -> torch.Tensor:
        """``[head, row, ...]`` of a stored ``[batch, head, row, ...]`` tensor as a new float32 tensor (never
        a view of the file or of the capture's own tensors)."""
        if heads == list(range(num_heads)):  # every head: one strided read instead of one per head
            view = self.tensors.slice(name, (slice(batch, batch + 1), slice(None), rows))[0]
            return torch.empty(view.shape, dtype=torch.float32).copy_(view)
        return torch.stack([self.tensors.slice(name, (slice(batch, batch + 1), slice(h, h + 1), rows))[0, 0] for h in heads]).float()

    def recompute(self, site: Site, batch: int, heads: list[int], queries: slice, *, mask: torch.Tensor | None = None
                  ) -> torch.Tensor:
        """Weights recomputed from the stored Q, K and mask (float32); ``mask`` is ``mask_rows`` for the
        same rows when the caller already has it. Equal element for element to the softmax of
        :meth:`logits` for the same rows."""
        return attention.softmax_weights(self.logits(site, batch, heads, queries, mask=mask), torch.float32)

    def logits(self, site: Site, batch: int, heads: list[int], queries: slice, *, mask: torch.Tensor | None = None
               ) -> torch.Tensor:
        """The masked scores ``[head, query, key]`` (float32) the weights of a site without stored weights are the
        softmax of: ``q.k * scaling`` (soft-capped where the model caps) plus the additive mask, in the order of
        transformers' ``eager_attention_forward`` (:func:`inspector.store.attention.attention_weights`). A fresh
        tensor the caller may overwrite.

        Raises InspectorError when the site stores no Q and K, or passes attention arguments the file cannot
        express."""
        if not {"q", "k"} <= set(site.parts):
            raise InspectorError(f"site {site.name} stores neither weights nor Q/K, so its weights cannot be shown")
        if not site.recomputable:
            raise InspectorError(
                f"site {site.name} ({site.module_class}) passes {', '.join(site.extra_kwargs)} to attention, which the file "
                "cannot express: capture it with weights (drop --no-weights)"
            )
        qn, kn = site.tensor_name("q"), site.tensor_name("k")
        kv_heads = [site.head_map[h] for h in heads]
        q = self._rows(qn, batch, heads, queries, site.num_heads)
        key = (kn, batch, tuple(kv_heads))
        cached = self._k_cache
        if cached is not None and cached[0] == key:
            k = cached[1]
        else:
            k = self._rows(kn, batch, kv_heads, slice(None), site.num_kv_heads)
            self._k_cache = (key, k)
        if mask is None:
            mask = self.mask_rows(site, batch, queries)
        if mask is not None and mask.shape[0] > 1:
            mask = mask[heads]
        return attention.masked_scores(q, k, scaling=site.scaling, mask=mask, softcap=site.softcap)

    # ---- file -----------------------------------------------------------------------------
    def header(self) -> dict[str, Any]:
        """The file's ``inspector`` header: the metadata with the schema version, the input records and the sites."""
        meta = dict(self.meta)
        meta["schema"] = SCHEMA
        meta["inputs"] = [r.to_dict() for r in self.inputs]
        meta["sites"] = [s.to_dict() for s in self.sites]
        used = {s.mask for s in self.sites if s.mask is not None}
        meta["masks"] = {name: spec for name, spec in self.masks.items() if name in used}
        return meta

    def save(self, path: str | os.PathLike, *, force: bool = False) -> Path:
        """Write the capture to ``path`` (see :func:`save`); returns the path written."""
        return save(self, path, force=force)

    def _repr_html_(self) -> str:
        from inspector.store.display import capture_html

        return capture_html(self)


def save(capture: Capture, path: str | os.PathLike, *, force: bool = False) -> Path:
    """Write ``capture`` to ``path`` (schema 2) without ever losing work (see :mod:`inspector.store.files`): a
    temporary file in the same folder, then a rename; ``-`` or a FIFO/device is written directly.

    Raises InspectorError for a name not ending in ``.safetensors``, for an existing ``.safetensors`` that
    is not a capture (a model's weights, say) unless ``force``, and for a write the system refuses (the
    old file is then unchanged).
    """
    from safetensors.torch import save as save_bytes
    from safetensors.torch import save_file

    from inspector.store.files import is_special, is_stdout, plain_mode, strict_json, write_atomic

    if not is_stdout(path):
        path = Path(path)
        if path.suffix != ".safetensors" and not is_special(path):
            raise InspectorError(f"capture files end in .safetensors; got {path.name!r}: rename the output (-o run.safetensors)")
        check_replaceable(path, force)
    tensors = {name: capture.tensors[name].contiguous() for name in capture.tensors.keys()}
    metadata = {"inspector": strict_json(capture.header(), ensure_ascii=False)}  # no NaN: strict readers take it

    def fill(tmp: str) -> None:
        save_file(tensors, tmp, metadata=metadata)
        plain_mode(tmp)  # safetensors writes the file anew

    return write_atomic(path, fill, lambda f: f.write(save_bytes(tensors, metadata=metadata)))


# torch-free, so the command line checks an output before it imports torch; part of this module's API
from inspector.store.header import check_replaceable, is_capture_file  # noqa: E402,F401


def load(path: str | os.PathLike) -> Capture:
    """Open a capture file memory-mapped, checked (:mod:`inspector.store.validate`); one clear line if it is not
    a readable, sound capture."""
    from safetensors import safe_open

    path = Path(path)
    if path.is_dir():
        raise InspectorError(f"{path} is a folder, not a capture file: give the .safetensors file inside it")
    if not path.is_file():
        raise InspectorError(f"{path} does not exist: make a capture with `inspector capture ... -o {path.name}`")
    validate.header_length(path)  # bounded before safetensors or json parse anything
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
    except Exception as exc:
        reason = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise InspectorError(
            f"{path} is not a readable capture file (safetensors says: {reason}); it may be truncated or not a capture: "
            "make it again with `inspector capture`"
        ) from None
    if "inspector" not in metadata:
        raise InspectorError(f"{path} is a safetensors file but not an inspector capture (no 'inspector' header): make one with `inspector capture`")
    tensors = _FileTensors(path)
    shapes = {name: tensors.shape(name) for name in tensors.keys()}
    dtypes = {name: tensors.dtype(name) for name in shapes}
    meta = validate.parse_inspector(path, metadata["inspector"], shapes)
    validate.check_capture(path, meta, dtypes, shapes, schema_max=SCHEMA, read=lambda name: tensors[name])
    sites = [Site.from_dict(d) for d in meta["sites"]]
    for s in sites:  # value norms (issue 10) are [batch, head, key]: small enough to check whole
        if "value_norm" in s.parts:
            t = tensors[f"{s.name}/value_norm"]
            if not bool(torch.isfinite(t).all()) or bool((t < 0).any()):
                raise validate.refuse(path, f"site {s.name!r}", f"tensor '{s.name}/value_norm' holds negative or non-finite "
                                      "values, which no norm has")
    if meta["schema"] < 2:  # schema 1: each mask is one dense float tensor, named by the site's field
        meta = dict(meta, masks={})
    cap = Capture(meta, sites, tensors)
    cap.source = path
    return cap
