"""The one error type the command line turns into a one-line message and exit status 2."""


class UserError(Exception):
    """Something the user asked for or supplied is wrong or missing; the message says what to do."""
