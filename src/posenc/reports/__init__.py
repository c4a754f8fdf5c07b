"""Reports, one family: the figure and markdown-table helpers every report uses (``render``), compare's report
(``compare``) and its paper-claims section (``claims``), synthetic-task tables and horizons (``tasks``), the
scoreboard, ``posenc report`` of several runs (``runs``), ``posenc diagnose`` (``diagnose``) and the pretrained
report (``pretrained``). On the layers below (core to ``config``)."""
