"""The one exception type inspector raises for things a user can fix.

Every message is a single line that says what is wrong and what to do about it; the CLI prints it
as-is and exits non-zero, the app shows it in an error box.
"""


class InspectorError(ValueError):
    """A user-facing error: bad input, a missing model, a file that is not a capture."""
