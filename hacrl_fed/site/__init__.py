"""The site's side of the federation around its agent worker: what it does with each order
(the worker calls behind the ClientApp), the link to the worker, and the site's terminal status.

Light on purpose (no torch, no Flower): Flower's ClientApp uses it in a fresh process for every message.
"""
