"""The site side of the federation around its agent worker: the link to the worker and the site's terminal status.

Light on purpose (no torch): Flower's per-message ClientApp uses it in a fresh process for every message.
"""
