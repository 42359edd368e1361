"""The wire protocol and its security: signed envelopes, roster and keys, TLS certificates, batch validation.

Transport-free and light (``cryptography`` and the generated protobufs only): the coordinator,
the site and the worker all speak it, and none of it knows Flower or gRPC.
"""
