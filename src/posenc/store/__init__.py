"""What a run reads and leaves behind: YAML presets validated by pydantic, the one loader and ``--set``
(``presets``), atomic file writes (``checkpoint``), one process per run directory (``lock``), the typed records and
their one store (``records``), and the stamp of what decides a run's numbers (``stamp``). On the core only."""
