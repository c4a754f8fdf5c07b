"""Training: the loop and ``train`` (``loop``), its settings (``settings``), AdamW and the learning rate schedule
(``optimizer``), each step's batch and positions (``batches``), the compute dtype (``precision``), the resume point
(``resume``), Ctrl-C between steps (``signals``), a trained run's directory read back (``rundir``), the loss-trend
rule (``curves``), torchrun DDP (``distributed``) and TensorBoard / W&B tracking (``tracking``). On the layers below
(core to ``eval``)."""
