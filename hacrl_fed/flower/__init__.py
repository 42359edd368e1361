"""The Flower adapter, the only package that imports ``flwr``: ServerApp, ClientApp and the message records.

``flwr_app.toml`` is the Flower app manifest that ``hacrl-fed server`` submits with ``flwr run``.
"""
