"""The ``posenc`` command (``main``) and one module per subcommand (``*_cmd``: argument parsing and one call),
with what their parsers share (``common``). The top layer."""
