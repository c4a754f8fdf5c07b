"""The subcommands of ``posenc`` (``posenc.cli`` lists them), and what their parsers share."""


def shown(value) -> str:
    """A config value as a help string shows it: a list space-separated, None as 'none', a float as %g."""
    if isinstance(value, (list, tuple)):
        return " ".join(map(shown, value)) or "none"
    if isinstance(value, float):
        return f"{value:g}"
    return "none" if value is None else str(value)
