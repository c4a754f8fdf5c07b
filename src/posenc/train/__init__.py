"""The one training loop with its checkpoints and resume (``loop``), torchrun DDP (``distributed``) and
TensorBoard / W&B tracking (``tracking``). On the layers below (core to ``eval``)."""
