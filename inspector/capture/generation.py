"""What the model actually said: generate an output, to be captured teacher-forced afterwards.

Generation runs the model as the user would (its usual attention implementation, greedy unless
sampling options are passed through to ``model.generate``). The returned token ids are then fed to
:func:`inspector.capture.capture` as ``target_ids``, so one teacher-forced pass over prompt and
output records the generated tokens as queries like any other.
"""

from __future__ import annotations

from typing import Any

import torch

from inspector.capture.inputs import Encoded, encode_with_globals, max_positions, model_layout
from inspector.errors import InspectorError


def generate_target(model, tokenizer, text: str | list[str], max_new_tokens: int, *, global_tokens: list[str] | None = None,
                    **generate_kwargs: Any) -> list[list[int]]:
    """Generate up to ``max_new_tokens`` per text; return the output ids per row.

    ``global_tokens`` marks global tokens of the source for LED and Longformer (see
    :func:`inspector.capture.inputs.global_attention_mask`), so the summary is the one a capture with
    the same tokens reads.

    Encoder-decoder: the decoder sequence including its start token (what the decoder reads).
    Decoder-only: the new tokens after the prompt. Padding after an end-of-sequence is dropped.
    """
    if max_new_tokens < 1:
        raise InspectorError("--generate needs a positive number of tokens, e.g. --generate 40")
    layout = model_layout(model)
    if layout == "encoder" or not hasattr(model, "generate"):
        raise InspectorError(f"{type(model).__name__} does not generate text: pass a decoder or encoder-decoder model, or drop --generate")
    enc = encode_with_globals(model, tokenizer, text, global_tokens=global_tokens)
    check_room(model, tokenizer, enc, max_new_tokens)
    kwargs = {k: v for k, v in enc.model_kwargs.items()
              if k in ("input_ids", "attention_mask", "token_type_ids", "global_attention_mask")}
    generate_kwargs.setdefault("do_sample", False)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else getattr(model.config, "pad_token_id", None)
    if pad is not None:
        generate_kwargs.setdefault("pad_token_id", pad)
    with torch.no_grad():
        out = model.generate(**kwargs, max_new_tokens=max_new_tokens, **generate_kwargs)
    sequences = out.sequences if hasattr(out, "sequences") else out
    if layout == "decoder":
        sequences = sequences[:, kwargs["input_ids"].shape[1]:]
    eos = _as_set(getattr(model.generation_config, "eos_token_id", None)) | _as_set(getattr(model.config, "eos_token_id", None))
    rows = []
    for row in sequences.tolist():
        start = 1 if layout == "encoder-decoder" else 0
        for i in range(start, len(row)):
            if row[i] in eos:
                row = row[: i + 1]
                break
        rows.append(row)
    return rows


def _as_set(value) -> set[int]:
    if value is None:
        return set()
    return {int(v) for v in value} if isinstance(value, (list, tuple)) else {int(value)}


def check_room(model, tokenizer, enc: Encoded, max_new_tokens: int) -> None:
    """Refuse, before generating, a ``max_new_tokens`` that would run past the model's positions.

    Decoder-only: prompt + new tokens must fit; encoder-decoder: the decoder start token + new tokens.
    The message counts the prompt's tokens (special tokens included) and gives the largest N that fits.
    """
    limit = max_positions(model, tokenizer)
    if limit is None:
        return
    name = type(model).__name__
    if enc.layout == "decoder":
        used = int(enc.model_kwargs["input_ids"].shape[1])
        room = limit - used
        if room < 1:
            raise InspectorError(f"the prompt is {used} tokens, which fills all {limit} positions of {name}: shorten the prompt to "
                                 "generate anything")
        if max_new_tokens > room:
            raise InspectorError(f"the prompt is {used} tokens and {name} has {limit} positions, so at most {room} tokens can "
                                 f"be generated: use --generate {room} or less, or shorten the prompt")
    else:
        room = limit - 1  # the decoder reads its start token first
        if max_new_tokens > room:
            raise InspectorError(f"{name}'s decoder has {limit} positions, one taken by its start token, so at most {room} "
                                 f"tokens can be generated: use --generate {room} or less")


def fixed_output(model, tokenizer, source: str, output, *, global_tokens: list[str] | None = None):
    """``output`` (an :class:`~inspector.capture.output.Output`) with nothing left to generate: its text or ids as
    given, or the ids :func:`generate_target` gives for ``Output(generate=N)``, so that every pass of an analysis
    reads the same output. Raises :class:`InspectorError` for an encoder-decoder without an output (it produces
    text: the fix is ``--output`` or ``--generate N``)."""
    from inspector.capture.inputs import model_layout
    from inspector.capture.output import Output

    if output.generate:
        return Output.of(ids=generate_target(model, tokenizer, source, output.generate, global_tokens=global_tokens))
    if model_layout(model) == "encoder-decoder" and not output.given:
        raise InspectorError(f"{type(model).__name__} is an encoder-decoder: pass what it said with --output, or "
                             "--generate N")
    return output
