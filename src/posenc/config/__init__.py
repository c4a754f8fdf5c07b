"""Compare's preset as typed pydantic data: the plan each stage of a run receives (``plan``), read through
``posenc.store.presets``. On the layers below (core to ``train``)."""
