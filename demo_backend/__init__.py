"""The Northwind Outfitters demo backend: an order/refund system and an email service (ESP).

It runs as its own HTTP service, apart from Parley, so that the tool executor meets real
timeouts, outages and idempotency keys. `demo_backend.app.create_app` builds it; the seed data of
design.md's running example is in `demo_backend.data`.
"""
