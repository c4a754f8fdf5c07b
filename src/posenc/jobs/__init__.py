"""The jobs: the sweep runner (``compare`` with its synthetic-task jobs in ``retrieval``, one process per job in
``jobs``, each scheme's chosen setting in ``sweep``), context extension of pretrained models (``extend``) and
their fine-tuning (``finetune``). On every layer below but the CLI."""
