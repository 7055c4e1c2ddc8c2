"""``UserError``: the base of the errors a user causes (an argument, a data source, a model, a run directory).

The experiment scripts (``cli.run``) print such an error's message and exit with status 1, without a
traceback (``--debug`` shows it); any other exception is a bug and keeps its traceback. Each subclass also
derives from the built-in type it has always been (``ValueError``, ``FileNotFoundError``), so code that
catches those keeps working.
"""


class UserError(Exception):
    """An error in what the user asked for, with a message that says what to change."""
