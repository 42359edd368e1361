"""The trainer of a site over N processes (FSDP2): docs/distributed.md."""
