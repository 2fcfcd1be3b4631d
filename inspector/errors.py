"""The one exception type inspector raises for things a user can fix.

Every message is a single line that says what is wrong and what to do about it; the CLI prints it
as-is and exits non-zero, the app shows it in an error box.
"""


class InspectorError(ValueError):
    """A user-facing error: bad input, a missing model, a file that is not a capture."""


EMPTY_SOURCE = "the source text is empty"
SOURCE_FLAGS = "--source TEXT or --source-file FILE"


def empty_source(how: str = SOURCE_FLAGS) -> InspectorError:
    """The one refusal of an empty source text, for every command and API that takes one:
    ``the source text is empty: pass HOW`` (``how``: the flags or arguments that give it)."""
    return InspectorError(f"{EMPTY_SOURCE}: pass {how}")


def check_source(text: str | None, how: str = SOURCE_FLAGS) -> str:
    """``text`` when it has a non-blank character, else :func:`empty_source`'s refusal."""
    if not text or not text.strip():
        raise empty_source(how)
    return text
