"""Process orchestration: the ``server``, ``client`` and ``simulate`` commands and the supervision of their processes."""
